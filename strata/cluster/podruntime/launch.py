"""The container shim: ``python -I -S launch.py SPEC.json`` (standard library only, so it starts in
milliseconds and runs whatever the pod's environment holds).

``run`` mode makes the container: private mount, PID and UTS namespaces; a root of its own
(``RootFs``: the host's directories bind-mounted into a tmpfs, read-only for
readOnlyRootFilesystem); every volume bind-mounted where the spec mounts it (read-only where
asked); a fresh /proc; the pod's hostname; then it forks the container's process, which is PID 1
of its namespace, forwards signals to it and exits with its exit code (128 + signal when it was
killed). ``exec`` mode joins a running
container's namespaces to run a probe or hook command there.

No process outlives the runtime: the shim dies with its parent (PR_SET_PDEATHSIG), the
container's PID 1 dies with the shim, and when PID 1 dies the kernel kills everything else in
its PID namespace, whatever it forked or daemonised.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
START_ERROR_EXIT = 128
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def die_with_parent(parent: int) -> None:
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # the parent died before prctl: nothing would ever kill us
        os._exit(1)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    args = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(
        libc.mount(args[0], args[1], args[2], ctypes.c_ulong(flags), args[3]), f"mount {source} on {target}"
    )


def unmount(target: str) -> None:
    """Detach ``target`` (lazily: a process still using it keeps it until it lets go)."""
    _check(libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def resolve_in(root: str, path: str) -> str:
    """``path`` as seen from inside ``root`` (symlinks resolved within it), as a host path."""
    parts = [p for p in path.split("/") if p]
    current, hops = root, 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            current = os.path.dirname(current) if current != root else root
            continue
        candidate = os.path.join(current, part)
        if os.path.islink(candidate) and hops < 40:
            hops += 1
            link = os.readlink(candidate)
            parts = [p for p in link.split("/") if p] + parts
            current = root if link.startswith("/") else current
            continue
        current = candidate
    return current


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as table:
        return [line.split()[4] for line in table]


class RootFs:
    """A container's root: a tmpfs holding a bind mount of each of the host's top-level entries.
    A mount point missing on the host is made inside it (in the tmpfs, or in an overlay of the
    host directory that would hold it), so nothing is ever created on the host."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.covered: list[str] = []  # volume mount points and overlays: the container's own places
        self.overlays = 0

    def build(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        mount("tmpfs", self.root, "tmpfs", MS_NOSUID, "mode=755")
        for entry in sorted(os.listdir("/")):
            self._mirror("/" + entry)
        inner = self.root + self.root  # the recursive bind of the entry holding root copied it
        if os.path.ismount(inner):
            unmount(inner)

    def _mirror(self, host: str) -> None:
        inside = self.root + host
        if os.path.islink(host):
            os.symlink(os.readlink(host), inside)
        elif os.path.isdir(host):
            os.mkdir(inside)
            mount(host, inside, None, MS_BIND | MS_REC)
        else:
            open(inside, "a").close()
            mount(host, inside, None, MS_BIND)

    def make_read_only(self) -> None:
        """readOnlyRootFilesystem: the root and each mirrored top-level entry read-only (volumes
        stay as mounted)."""
        for entry in os.listdir(self.root):
            path = os.path.join(self.root, entry)
            if os.path.ismount(path) and path not in self.covered:
                mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        mount(None, self.root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID)

    def place(self, source: str, target: str, read_only: bool) -> None:
        inside = resolve_in(self.root, target)
        if not os.path.lexists(inside):
            self._create(inside, os.path.isdir(source))
        mount(source, inside, None, MS_BIND | MS_REC)
        if read_only:
            mount(None, inside, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        self.covered.append(inside)

    def _create(self, inside: str, directory: bool) -> None:
        ancestor = os.path.dirname(inside)
        while not os.path.isdir(ancestor):
            ancestor = os.path.dirname(ancestor)
        ours = ancestor == self.root or any(
            ancestor == c or ancestor.startswith(c + "/") for c in self.covered
        )
        if not ours:
            self._overlay(ancestor)
        os.makedirs(inside if directory else os.path.dirname(inside), exist_ok=True)
        if not directory:
            open(inside, "a").close()

    def _overlay(self, inside: str) -> None:
        """Make ``inside`` writable for this container only: an overlay on the host directory
        (mounts below it are bound again on top, so they stay visible)."""
        host = inside[len(self.root) :]
        self.overlays += 1
        work = os.path.join(self.root, ".strata-overlays", str(self.overlays))
        upper, scratch = os.path.join(work, "upper"), os.path.join(work, "work")
        os.makedirs(upper)
        os.makedirs(scratch)
        mount("overlay", inside, "overlay", 0, f"lowerdir={host},upperdir={upper},workdir={scratch}")
        self.covered.append(inside)
        for point in _mount_points():
            if point.startswith(host + "/") and os.path.isdir(self.root + point):
                mount(point, self.root + point, None, MS_BIND | MS_REC)


def mount_order(mounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parents before what is mounted inside them (a stable sort by depth): a pod volume at /tmp
    is mounted before, so does not hide, a virtualenv under /tmp mounted where it is."""
    return sorted(mounts, key=lambda m: str(m["target"]).count("/"))


def make_container(spec: dict[str, Any]) -> None:
    """Namespaces, root, mounts and hostname, in the shim, before the container's process exists."""
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = RootFs(str(spec["root"]))
    root.build()
    for item in mount_order(spec["mounts"]):
        root.place(item["source"], item["target"], item["read_only"])
    if spec.get("read_only_root"):
        root.make_read_only()
    hostname = str(spec.get("hostname", "")).encode()
    if hostname:
        _check(libc.sethostname(hostname, len(hostname)), "sethostname")
    os.chroot(root.root)


def join_container(shim: int) -> None:
    """Enter the namespaces of the container whose shim is ``shim``: the shim's own mount and UTS
    namespaces, and the PID namespace of its child (the container's PID 1). Every namespace is
    opened first: inside the container's mount namespace, /proc is the container's own."""
    kinds = (("mnt", CLONE_NEWNS), ("pid_for_children", CLONE_NEWPID), ("uts", CLONE_NEWUTS))
    fds = [(os.open(f"/proc/{shim}/ns/{kind}", os.O_RDONLY), kind, flag) for kind, flag in kinds]
    try:
        for fd, kind, flag in fds:
            _check(libc.setns(fd, flag), f"setns {kind} of pid {shim}")
    finally:
        for fd, _, _ in fds:
            os.close(fd)


def die_with_shim(alive: int) -> None:
    """In the child: PID 1 of a new namespace sees no parent (getppid() is 0), so the shim's
    liveness is a pipe whose write end only the shim holds: EOF means it is gone."""
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    os.set_blocking(alive, False)
    try:
        if os.read(alive, 1) == b"":
            os._exit(1)
    except BlockingIOError:
        pass
    os.close(alive)


def exec_child(spec: dict[str, Any], alive: int, errors: int | None, fresh_proc: bool) -> None:
    """In the forked child: the container's process itself (never returns)."""
    try:
        die_with_shim(alive)
        if fresh_proc:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        os.chdir(str(spec.get("cwd") or "/"))
        argv = [str(a) for a in spec["argv"]]
        os.execvpe(argv[0], argv, {str(k): str(v) for k, v in spec["env"].items()})
    except OSError as error:
        report(errors, f"exec {spec['argv'][0]}: {error.strerror or error}")
    os._exit(START_ERROR_EXIT)


def report(errors: int | None, message: str) -> None:
    """Say why the container could not start: in its log, and in the error file the runtime reads
    (opened before the container's root hid the host's paths)."""
    print(f"strata pod runtime: {message}", file=sys.stderr, flush=True)
    if errors is not None:
        os.write(errors, message.encode())


def wait_forwarding(child: int) -> int:
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: os.kill(child, signum))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    with open(argv[1]) as handle:
        spec = json.load(handle)
    path = spec.get("error_file")
    errors = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) if path else None
    try:
        die_with_parent(int(spec["parent"]))
        if spec["mode"] == "run":
            make_container(spec)
        else:
            join_container(int(spec["join"]))
            os.chroot(str(spec["root"]))
    except OSError as error:
        report(errors, f"cannot create the container: {error}")
        return START_ERROR_EXIT
    started = spec.get("started_fd")
    alive, held = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(held)
        if started is not None:  # closed by the exec: the runtime's EOF says the process runs
            os.set_inheritable(int(started), False)
        exec_child(spec, alive, errors, fresh_proc=spec["mode"] == "run")
    os.close(alive)
    if started is not None:
        os.close(int(started))
    return wait_forwarding(child)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
