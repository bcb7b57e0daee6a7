"""The sandbox's seccomp filter: a classic-BPF program that refuses the system calls sandboxed code never needs.

Namespaces and a private root decide what the program can *see*; this filter narrows what it can *ask the
kernel for*, which shrinks the kernel attack surface a namespace leaves open. Refused (``EPERM``):

* other processes' memory: ``ptrace``, ``process_vm_readv/writev``, ``kcmp``, ``pidfd_getfd``;
* new namespaces and mounts: ``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag, ``mount``,
  ``umount2``, ``pivot_root``, ``chroot``, the new mount API (``fsopen`` ... ``mount_setattr``);
* kernel facilities with a history of privilege-escalation bugs: ``bpf``, ``perf_event_open``,
  ``userfaultfd``, ``io_uring_*``, ``keyctl``/``add_key``/``request_key``, ``open_by_handle_at``;
* machine administration: modules, ``kexec``, ``reboot``, swap, ``acct``, ``syslog``, clocks, ``quotactl``,
  ``fanotify_init``, ``ioperm``/``iopl``, ``vhangup``, ``migrate_pages``;
* typing into a terminal: ``ioctl(TIOCSTI)`` / ``ioctl(TIOCLINUX)``.

``clone3`` answers ``ENOSYS`` (its flags live in memory a filter cannot read), so the C library falls back to
``clone``, whose flags the filter checks. A system call of another ABI (x32 on x86-64, or a foreign
architecture) is refused too. The program is built for x86-64 and aarch64; elsewhere :func:`build_filter`
returns ``None`` and the sandbox says that it runs without a filter.

The bytes are an array of ``struct sock_filter`` (what ``bwrap --seccomp FD`` reads and what
``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ...)`` installs).
"""

from __future__ import annotations

import platform
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_KILL_PROCESS = 0x80000000
_ERRNO = 0x00050000
EPERM, ENOSYS = 1, 38
CLONE_NEW_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_TTY_IOCTLS = (0x5412, 0x541C)  # TIOCSTI, TIOCLINUX
_X32_BIT = 0x40000000

DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "open_by_handle_at", "name_to_handle_at",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "syslog", "settimeofday", "clock_settime", "adjtimex", "clock_adjtime",
    "quotactl", "lookup_dcookie", "fanotify_init", "iopl", "ioperm", "vhangup", "migrate_pages",
)

# (AUDIT_ARCH_*, syscall numbers) from the kernel's uapi headers.
_TABLES = {
    "x86_64": (0xC000003E, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438,
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
        "mount_setattr": 442, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 250, "add_key": 248, "request_key": 249,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "reboot": 169, "swapon": 167,
        "swapoff": 168, "acct": 163, "syslog": 103, "settimeofday": 164, "clock_settime": 227, "adjtimex": 159,
        "clock_adjtime": 305, "quotactl": 179, "lookup_dcookie": 212, "fanotify_init": 300, "iopl": 172,
        "ioperm": 173, "vhangup": 153, "migrate_pages": 256, "clone": 56, "clone3": 435, "ioctl": 16,
    }),
    "aarch64": (0xC00000B7, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "pidfd_getfd": 438,
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
        "mount_setattr": 442, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 219, "add_key": 217, "request_key": 218,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "reboot": 142, "swapon": 224,
        "swapoff": 225, "acct": 89, "syslog": 116, "settimeofday": 170, "clock_settime": 112, "adjtimex": 171,
        "clock_adjtime": 266, "quotactl": 60, "lookup_dcookie": 18, "fanotify_init": 262,
        "vhangup": 58, "migrate_pages": 238, "clone": 220, "clone3": 435, "ioctl": 29,
    }),
}


def _machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def supported() -> bool:
    return _machine() in _TABLES


class _Assembler:
    """Classic-BPF instructions with symbolic jump targets, resolved to relative offsets by :meth:`assemble`."""

    def __init__(self):
        self.prog: list[tuple[int, int, int, int]] = []  # (code, jt, jf, k)
        self.labels: dict[str, int] = {}
        self.fixups: list[tuple[int, str, str]] = []

    def emit(self, code: int, k: int, jt: str = "", jf: str = "") -> None:
        if jt or jf:
            self.fixups.append((len(self.prog), jt, jf))
        self.prog.append((code, 0, 0, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.prog)

    def assemble(self) -> bytes:
        prog = list(self.prog)
        for pc, jt, jf in self.fixups:
            code, _, _, k = prog[pc]
            offsets = [self.labels[t] - pc - 1 if t else 0 for t in (jt, jf)]
            if not all(0 <= o <= 255 for o in offsets):
                raise AssertionError(f"seccomp jump out of range at {pc}: {offsets}")
            prog[pc] = (code, offsets[0], offsets[1], k)
        return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def _check_arch(asm: _Assembler, arch: int, x32_possible: bool) -> None:
    """A foreign architecture is killed; an x32 system call (x86-64 only) is refused."""
    asm.emit(_LD_W_ABS, _ARCH)
    asm.emit(_JEQ_K, arch, jt="arch_ok", jf="kill")
    asm.label("arch_ok")
    asm.emit(_LD_W_ABS, _NR)
    if x32_possible:
        asm.emit(_JGE_K, _X32_BIT, jt="deny", jf="next0")
        asm.label("next0")


def _deny_numbers(asm: _Assembler, numbers: list[int]) -> None:
    for i, number in enumerate(numbers):
        asm.emit(_JEQ_K, number, jt="deny", jf=f"d{i}")
        asm.label(f"d{i}")


def _dispatch_on_arguments(asm: _Assembler, nr: dict[str, int]) -> None:
    """``clone3`` -> ENOSYS; ``clone`` and ``ioctl`` go to their argument checks; anything else is allowed."""
    asm.emit(_JEQ_K, nr["clone3"], jt="enosys", jf="not_clone3")
    asm.label("not_clone3")
    asm.emit(_JEQ_K, nr["clone"], jt="clone", jf="not_clone")
    asm.label("not_clone")
    asm.emit(_JEQ_K, nr["ioctl"], jt="ioctl", jf="allow")


def _check_clone_flags(asm: _Assembler) -> None:
    asm.label("clone")
    asm.emit(_LD_W_ABS, _ARG0)  # low 32 bits of the flags (little-endian)
    asm.emit(_AND_K, CLONE_NEW_FLAGS)
    asm.emit(_JEQ_K, 0, jt="allow", jf="deny")


def _check_tty_ioctls(asm: _Assembler) -> None:
    asm.label("ioctl")
    asm.emit(_LD_W_ABS, _ARG1)  # the request number
    for j, request in enumerate(_TTY_IOCTLS):
        asm.emit(_JEQ_K, request, jt="deny", jf=f"t{j}")
        asm.label(f"t{j}")


def _verdicts(asm: _Assembler) -> None:
    for name, value in (("allow", _ALLOW), ("deny", _ERRNO | EPERM), ("enosys", _ERRNO | ENOSYS),
                        ("kill", _KILL_PROCESS)):
        asm.label(name)
        asm.emit(_RET_K, value)


def build_filter(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one) as raw ``sock_filter`` bytes, or ``None`` if unsupported."""
    machine = machine or _machine()
    table = _TABLES.get(machine)
    if table is None:
        return None
    arch, nr = table
    asm = _Assembler()
    _check_arch(asm, arch, x32_possible=machine == "x86_64")
    _deny_numbers(asm, [nr[name] for name in DENIED if name in nr])
    _dispatch_on_arguments(asm, nr)
    _check_clone_flags(asm)
    _check_tty_ioctls(asm)
    _verdicts(asm)
    return asm.assemble()


__all__ = ["DENIED", "build_filter", "supported"]
