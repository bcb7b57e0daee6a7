"""Built-in demonstrations that train a tiny model on this CPU: addition, tool use, vision."""
