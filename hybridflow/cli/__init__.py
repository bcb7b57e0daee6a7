"""The ``hybridflow`` console script: train, sft, quickstart, generate, merge, data, sandbox, report.

Each sub-command is a thin front door to a library function so everything a command does can also
be called from Python (and debugged there). Heavy imports happen inside the sub-command so that
``hybridflow train --dry-run`` answers in about a second. Every command answers ``--help``; a user error (a bad
option, key or value, a missing file, no network for a download) is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hybridflow.cli.args import CommandParser, one_line
from hybridflow.launch.command_line import EXIT_CONFIG_ERROR, user_error_types
from hybridflow.utils.quiet import quiet_libraries

USAGE = """hybridflow <command> [args]

commands:
  train [--dry-run] [--config-path DIR --config-name NAME] key=value ...
                     PPO/GRPO training with verl's config keys (same as python -m hybridflow.trainer.main_ppo);
                     train --help lists the config groups, train --help NODE a node's keys and defaults
  sft key=value ...  supervised fine-tuning (also used to warm up models before RL)
  quickstart [--task addition|tool-use|vision|judge] [--output-dir DIR]
                     train a built-in tiny model on a built-in task on this CPU and report before/after
                     (tool-use: GRPO through tool_agent teaches it to call a calculator; judge: GRPO on the
                     scores of a small judge model trained at run time, measured by an exact rule)
  generate / eval    generate from a model for a dataset and score it
  merge CKPT_DIR TARGET_DIR
                     export a checkpoint (LoRA merged) to a Hugging Face folder
  data NAME ...      write verl-format parquet for a dataset (gsm8k [--tool], math, countdown, synthetic tasks)
  sandbox serve [--host H --port P --token T --workers N]
                     serve the SandboxFusion API (/run_code) on the local code sandbox (loopback, token)
  sandbox check      which isolation modes work here, and which one code rewards will use
  report RUN_DIR [--serve] [--port P]
                     write RUN_DIR/report.html from its metrics.jsonl, or serve it live on 127.0.0.1 while the
                     run writes (refreshed as metrics.jsonl grows)

hybridflow <command> --help: the command's options.
"""


def entry() -> None:
    """The ``hybridflow`` console script: :func:`main`, then a quick exit (hybridflow.utils.fast_exit)."""
    from hybridflow.utils.fast_exit import run_and_exit

    run_and_exit(_main_to_a_pipe)


def _main_to_a_pipe() -> int:
    """:func:`main`, quiet when its reader goes away (``hybridflow train --help NODE | head``)."""
    import os

    try:
        return main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 0


def main(argv: list[str] | None = None) -> int:
    quiet_libraries()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    handlers = {
        "train": cmd_train,
        "sft": cmd_sft,
        "quickstart": cmd_quickstart,
        "generate": cmd_generate,
        "eval": lambda rest: cmd_generate(rest, "eval"),
        "merge": cmd_merge,
        "data": cmd_data,
        "sandbox": cmd_sandbox,
        "report": cmd_report,
    }
    if cmd not in handlers:
        from hybridflow.utils.registry import closest

        hint = closest(cmd, list(handlers))
        print(f"hybridflow: unknown command '{cmd}'" + (f"; did you mean '{hint}'?" if hint else "")
              + f" (commands: {', '.join(handlers)}; hybridflow --help)", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    try:
        result = handlers[cmd](rest)
    except user_error_types() as e:  # the input is wrong: its message names the field and the fix
        print(f"hybridflow {cmd}: {one_line(e)}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return result if isinstance(result, int) else 0  # sub-commands may return their result object


def cmd_train(argv: list[str]) -> int:
    from hybridflow.trainer.main_ppo import main as train_main

    return train_main(argv)


def cmd_sft(argv: list[str]) -> int:
    from hybridflow.cli.help import sft_help, wants_help

    if wants_help(argv):
        return sft_help(argv)
    from hybridflow.sft.config import load_sft_config

    try:
        load_sft_config(argv)  # a bad key or value: one line, before any process starts
    except ValueError as e:
        print(f"hybridflow sft: {one_line(e)} (keys: hybridflow sft --help)", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    from hybridflow.sft.trainer import main as sft_main

    sft_main(argv)
    return 0


def cmd_quickstart(argv: list[str]) -> int:
    parser = CommandParser(prog="hybridflow quickstart", description="Train a tiny model on CPU.")
    parser.add_argument("--output-dir", default=None,
                        help="default outputs/quickstart, outputs/quickstart_tool_use, outputs/quickstart_vision or "
                             "outputs/quickstart_judge")
    parser.add_argument("--backend", default="local", choices=["local", "ray"])
    parser.add_argument("--max-seconds", type=float, default=None, help="wall-clock budget for RL")
    parser.add_argument("--task", default="addition", choices=["addition", "tool-use", "vision", "judge"],
                        help="addition: GRPO on 2-digit sums; tool-use: GRPO through tool_agent with a calculator; "
                             "vision: a tiny vision-language model learns to name the colour of a shape in a picture; "
                             "judge: GRPO on a small judge model's scores (RLAIF), checked by an exact rule")
    parser.add_argument("--seed", type=int, default=None, help="run seed (default 1)")
    parser.add_argument("--judge-mode", default=None, choices=["reference", "direct"],
                        help="judge task: reference (the judge works the sum out first, default) or direct (it is told "
                             "no answer and grades in one turn)")
    args = parser.parse_args(argv)
    if args.judge_mode is not None and args.task != "judge":
        parser.error("--judge-mode is for --task judge")
    if args.task == "tool-use":
        return _quickstart_tool_use(args)
    kwargs = {"backend": args.backend}
    if args.seed is not None:
        kwargs["seed"] = args.seed
    if args.max_seconds is not None:
        kwargs["max_seconds"] = args.max_seconds
    if args.task == "judge":
        from hybridflow.quickstart.judge import JudgeTooWeak, run_judge_quickstart

        if args.judge_mode is not None:
            kwargs["judge_mode"] = args.judge_mode
        try:
            run_judge_quickstart(output_dir=args.output_dir or "outputs/quickstart_judge", **kwargs)
        except JudgeTooWeak as exc:
            print(f"hybridflow quickstart --task judge: stopped before RL: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.task == "vision":
        from hybridflow.quickstart.vision import run_vision_quickstart

        run_vision_quickstart(output_dir=args.output_dir or "outputs/quickstart_vision", **kwargs)
        return 0
    from hybridflow.quickstart.addition import run_quickstart

    run_quickstart(output_dir=args.output_dir or "outputs/quickstart", **kwargs)
    return 0


def _quickstart_tool_use(args: argparse.Namespace) -> int:
    if args.max_seconds is not None:
        print("hybridflow quickstart: --max-seconds does not apply to --task tool-use, which runs a fixed "
              "number of steps (drop --max-seconds)", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    from hybridflow.quickstart.tool_use import run_tool_use_quickstart

    kwargs = {"output_dir": args.output_dir or "outputs/quickstart_tool_use", "backend": args.backend}
    if args.seed is not None:
        kwargs["seed"] = args.seed
    run_tool_use_quickstart(**kwargs)
    return 0


def cmd_generate(argv: list[str], cmd: str = "generate") -> int:
    from hybridflow.cli.generate import main as gen_main

    return gen_main(argv, cmd) or 0


def cmd_merge(argv: list[str]) -> int:
    parser = CommandParser(prog="hybridflow merge", description="Export a checkpoint to an HF folder.")
    parser.add_argument("local_dir", help="checkpoint folder, e.g. checkpoints/proj/exp/global_step_10/actor")
    parser.add_argument("target_dir", help="where to write the Hugging Face model")
    args = parser.parse_args(argv)
    if not Path(args.local_dir).is_dir():
        parser.error(f"no checkpoint folder {args.local_dir} (a global_step_N folder or its actor/ sub-folder)")
    from hybridflow.cli.merge import merge_checkpoint

    path = merge_checkpoint(args.local_dir, args.target_dir)
    print(f"wrote Hugging Face model to {path}")
    return 0


def cmd_data(argv: list[str]) -> int:
    from hybridflow.data.preprocess import DATA_COMMANDS

    if not argv or argv[0] in ("-h", "--help"):
        print("hybridflow data NAME [options]\n\ndatasets:")
        for name, spec in DATA_COMMANDS.items():
            print(f"  {name:<14} {spec[0]}")
        return 0
    name = argv[0]
    if name not in DATA_COMMANDS:
        from hybridflow.utils.registry import closest

        hint = closest(name, list(DATA_COMMANDS))
        print(f"hybridflow data: unknown dataset '{name}'" + (f"; did you mean '{hint}'?" if hint else "")
              + f". Known: {', '.join(DATA_COMMANDS)}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    description, setup, run = DATA_COMMANDS[name]
    parser = CommandParser(prog=f"hybridflow data {name}", description=description)
    setup(parser)
    written = run(parser.parse_args(argv[1:]))
    paths = written.values() if isinstance(written, dict) else (written or [])
    for path in paths:
        print(f"wrote {path}")
    return 0


def cmd_sandbox(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("hybridflow sandbox serve [--host 127.0.0.1] [--port 8080] [--token T] [--allow-host NAME] "
              "[--workers 4] [--max-timeout 60] [--max-memory-mb 4096] [--idle-timeout 30] [--max-connections 512] "
              "[--isolation auto|namespace|bwrap|userns|audit]\nhybridflow sandbox check")
        return 0
    if argv[0] == "check":
        return _sandbox_check()
    if argv[0] != "serve":
        print(f"hybridflow sandbox: unknown sub-command '{argv[0]}'; use 'hybridflow sandbox serve' or "
              "'hybridflow sandbox check'", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    from hybridflow.sandbox.http_service import main as serve_main

    return serve_main(argv[1:])


def cmd_report(argv: list[str]) -> int:
    from hybridflow.cli.report import main as report_main

    return report_main(argv)


def _sandbox_check() -> int:
    from hybridflow.sandbox.limits import SandboxConfig
    from hybridflow.sandbox.modes import DESCRIPTIONS, OS_MODES, SandboxUnavailable, probe, resolve_isolation

    for mode in OS_MODES:
        ok, why = probe(mode)
        print(f"{mode:10s} {'works' if ok else 'no: ' + why}")
    print(f"{'audit':10s} works, but only when asked for by name ({DESCRIPTIONS['audit']})")
    try:
        print(f"isolation=auto uses: {resolve_isolation(SandboxConfig(), quiet=True)}")
    except SandboxUnavailable as e:
        print(f"isolation=auto: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
