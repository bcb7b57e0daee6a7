"""The code reward's test harness for ``assert`` tests (stdlib only: its source is the program the sandbox runs;
hybridflow never imports it).

Why: when the model's program and the test share one interpreter, the program decides the verdict. ``exit()``,
``sys.exit(0)``, ``os._exit(0)`` or an ``atexit``/``sys.excepthook`` exit before the first ``assert`` ends the
run "successfully", and an object whose ``__eq__`` always answers True passes every ``assert f(x) == y``.

How: the harness forks **before** it knows anything about the test. The child (the *program process*) closes
stdin and stdout, receives the model's code over a pipe, runs it, and then only answers requests: look up a
name, read an attribute, call something, list an iterable. Every answer crosses the pipe as plain data (None,
bool, int, float, str, bytes, list, tuple, dict, set, frozenset, rebuilt exactly on this side) or as a handle
to an object that stays over there. The parent (the *test process*) then reads the job from stdin (a random
nonce, the code, the test's set-up and its asserts), runs the set-up and each assert itself, with the program's
names bound to proxies, and prints ``<nonce> <i> pass`` only after assert ``i`` ran to its end.

So the verdict comes from code the model cannot touch: it never sees the nonce, the expected values or the
assert (they reach the parent after the fork), it cannot write to the parent's stdout (it has none) or read
the parent's memory (the parent is not dumpable; in the OS sandboxes ``ptrace`` is refused), and a value it
returns is compared by builtin code on this side: a handle is never equal to a plain value and has no truth
value. Exiting early, crashing or hanging means no ``pass`` line: the case scores 0. The host
(``hybridflow.rewards.code``) checks the nonce lines outside the sandbox; the exit code is ignored.
"""

import builtins
import json
import os
import sys

MAX_MESSAGE = 64 << 20
MAX_NODES = 1_000_000
_PLAIN_ATOMS = (type(None), bool, int, float, str)


class ProgramError(Exception):
    """The program process failed a request (its exception is re-raised as a builtin type when it is one)."""


class ProgramGone(ProgramError):
    """The program process exited or broke the protocol."""


# ------------------------------------------------------------------------------------------------ wire
def _write(fd, obj):
    data = json.dumps(obj, allow_nan=True).encode()
    data = len(data).to_bytes(8, "little") + data
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise ProgramGone("the program process exited")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read(fd):
    size = int.from_bytes(_read_exact(fd, 8), "little")
    if size > MAX_MESSAGE:
        raise ProgramGone(f"the program process sent {size} bytes (limit {MAX_MESSAGE})")
    try:
        return json.loads(_read_exact(fd, size))
    except (ValueError, RecursionError):
        raise ProgramGone("the program process sent something that is not JSON") from None


# ------------------------------------------------------------------------------------------------ values
def encode(value, handle_of, budget=None):
    """Plain data -> JSON-able tree; anything else -> ``{"h": id}`` from ``handle_of`` (which may refuse)."""
    budget = budget if budget is not None else [MAX_NODES]
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError("value too large to send")
    kind = type(value)
    if kind is float and value != value or kind is float and value in (float("inf"), float("-inf")):
        return {"f": repr(value)}
    if kind in _PLAIN_ATOMS:
        return value
    if kind is list:
        return [encode(v, handle_of, budget) for v in value]
    if kind is tuple:
        return {"t": [encode(v, handle_of, budget) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, handle_of, budget), encode(v, handle_of, budget)] for k, v in value.items()]}
    if kind is set or kind is frozenset:
        return {"s" if kind is set else "fs": [encode(v, handle_of, budget) for v in value]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    return {"h": handle_of(value)}


def decode(tree, from_handle, depth=0):
    """The inverse of :func:`encode`: builds only builtin containers (handles via ``from_handle``)."""
    if depth > 500:
        raise ProgramGone("value nested too deeply")
    if tree is None or type(tree) in (bool, int, float, str):
        return tree
    if type(tree) is list:
        return [decode(v, from_handle, depth + 1) for v in tree]
    if type(tree) is not dict or len(tree) != 1:
        raise ProgramGone("malformed value from the program process")
    (tag, body), = tree.items()
    if tag == "t":
        return tuple(decode(v, from_handle, depth + 1) for v in body)
    if tag == "d":
        return {decode(k, from_handle, depth + 1): decode(v, from_handle, depth + 1) for k, v in body}
    if tag == "s":
        return {decode(v, from_handle, depth + 1) for v in body}
    if tag == "fs":
        return frozenset(decode(v, from_handle, depth + 1) for v in body)
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "f":
        return float(body)
    if tag == "c":
        return complex(*body)
    if tag == "h" and type(body) is int:
        return from_handle(body)
    raise ProgramGone(f"unknown value tag {tag!r} from the program process")


# ------------------------------------------------------------------------------------------------ program side
def serve(requests_fd, answers_fd):
    """(the program process) run the model's code, then answer requests until the pipe closes."""
    objects, ids = {}, {}

    def handle_of(obj):
        key = id(obj)
        if key not in ids:
            ids[key] = len(objects)
            objects[ids[key]] = obj
        return ids[key]

    def answer(value):
        try:
            return {"ok": encode(value, handle_of)}
        except (ValueError, RecursionError):
            return {"ok": {"h": handle_of(value)}}

    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
    while True:
        try:
            msg = _read(requests_fd)
        except ProgramGone:
            return
        op = msg.get("op")
        try:
            if op == "load":
                exec(compile(msg["code"], "main.py", "exec"), namespace)
                reply = {"ok": {"d": [[k, answer(v)["ok"]] for k, v in list(namespace.items())
                                      if isinstance(k, str) and k.isidentifier() and not k.startswith("__")]}}
            elif op == "getattr":
                reply = answer(getattr(objects[msg["h"]], msg["name"]))
            elif op == "call":
                args = [decode(a, objects.__getitem__) for a in msg["args"]]
                kwargs = {k: decode(v, objects.__getitem__) for k, v in msg["kwargs"].items()}
                reply = answer(objects[msg["h"]](*args, **kwargs))
            elif op == "list":
                reply = answer(list(objects[msg["h"]]))
            else:
                reply = {"raise": ["RuntimeError", f"unknown request {op!r}"]}
        except BaseException as e:  # SystemExit too: the request failed, the harness decides
            reply = {"raise": [type(e).__name__, str(e)[:2000]]}
        _write(answers_fd, reply)


# ------------------------------------------------------------------------------------------------ test side
class ProgramObject:
    """Stands for an object that lives in the program process: call it, read its attributes, iterate it.
    It equals nothing but itself and has no truth value, so no answer of the program is mistaken for
    success."""

    __slots__ = ("_link", "_handle")

    def __init__(self, link, handle):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_handle", handle)

    def __call__(self, *args, **kwargs):
        return self._link.request({"op": "call", "h": self._handle, "args": [self._link.send(a) for a in args],
                                   "kwargs": {k: self._link.send(v) for k, v in kwargs.items()}})

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._link.request({"op": "getattr", "h": self._handle, "name": name})

    def __iter__(self):
        return iter(self._link.request({"op": "list", "h": self._handle}))

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def __hash__(self):
        return hash(("program-object", self._handle))

    def __bool__(self):
        raise TypeError("an object of the program has no truth value in a test")

    def __repr__(self):
        return f"<program object #{self._handle}>"


def _handle_of_proxy(obj):
    if type(obj) is ProgramObject:
        return obj._handle
    raise TypeError(f"a {type(obj).__name__} made by the test cannot be sent to the program; tests pass plain data")


class Link:
    """The test process's end of the pipes."""

    def __init__(self, requests_fd, answers_fd):
        self.requests_fd, self.answers_fd = requests_fd, answers_fd
        self.proxies = {}

    def proxy(self, handle):
        if handle not in self.proxies:
            self.proxies[handle] = ProgramObject(self, handle)
        return self.proxies[handle]

    def send(self, value):
        return encode(value, _handle_of_proxy)

    def request(self, msg):
        try:
            _write(self.requests_fd, msg)
        except OSError:
            raise ProgramGone("the program process exited") from None
        reply = _read(self.answers_fd)
        if type(reply) is not dict:
            raise ProgramGone("malformed answer from the program process")
        if "raise" in reply:
            name, text = (list(reply["raise"]) + ["", ""])[:2]
            kind = getattr(builtins, str(name), None)
            if isinstance(kind, type) and issubclass(kind, Exception) and kind is not AssertionError:
                raise kind(str(text))
            raise ProgramError(f"{name}: {text}")
        return decode(reply.get("ok"), self.proxy)


def _program_process(requests_r, answers_w):
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # its prints go to stderr: the test process's stdout is not reachable from here
    keep = {0, 1, 2, requests_r, answers_w}
    for fd in range(3, 1024):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False, buffering=1)
    serve(requests_r, answers_w)


def _not_dumpable():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except Exception:
        pass  # audit mode refuses ctypes; its hook refuses /proc reads instead


def main():
    _not_dumpable()
    requests_r, requests_w = os.pipe()
    answers_r, answers_w = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        print(f"hybridflow-harness-error: cannot fork the program process ({e}); the code reward needs a "
              "sandbox mode that allows two processes", flush=True)
        return
    if pid == 0:
        os.close(requests_w)
        os.close(answers_r)
        try:
            _program_process(requests_r, answers_w)
        finally:
            os._exit(0)
    os.close(requests_r)
    os.close(answers_w)
    job = json.loads(sys.stdin.read())
    nonce, asserts = job["nonce"], job["asserts"]
    link = Link(requests_w, answers_r)
    scope = {"__name__": "__hybridflow_test__", "__builtins__": builtins}
    try:
        names = link.request({"op": "load", "code": job["code"]})
        scope.update({k: v for k, v in names.items() if type(k) is str and k.isidentifier()})
        exec(compile(job.get("prelude") or "", "<test set-up>", "exec"), scope)
    except BaseException as e:
        print(f"{nonce} setup fail {type(e).__name__}", flush=True)
        sys.stderr.write(f"hybridflow harness: the program or the test set-up failed: {type(e).__name__}: {e}\n")
        return
    for i, source in enumerate(asserts):
        try:
            exec(compile(source, f"<test {i}>", "exec"), scope)
        except BaseException as e:
            print(f"{nonce} {i} fail {type(e).__name__}", flush=True)
            sys.stderr.write(f"hybridflow harness: test {i} failed: {type(e).__name__}: {e}\n")
            continue
        print(f"{nonce} {i} pass", flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
