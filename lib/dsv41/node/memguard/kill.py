"""How the memory guard stops the ranks when it trips: SIGKILL through pidfds (no pid-reuse race), the
victims' memory reaped at once (process_mrelease), and systemctl for their units, whose failures are
logged, never raised.
"""
import ctypes
import os
import signal
import subprocess


def systemctl(argv, log, timeout=10):
    """Run systemctl; failures are logged, never raised. Returns stdout or None."""
    try:
        res = subprocess.run(["systemctl", *argv], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as err:
        log(f"systemctl {' '.join(argv)}: {err}")
        return None
    if res.returncode != 0:
        log(f"systemctl {' '.join(argv)}: exit {res.returncode}: {' '.join(res.stderr.split())[:300]}")
        return None
    return res.stdout


def kill_all(pids, log):
    """SIGKILL each pid (through a pidfd: no pid-reuse race). Returns ({pid: result}, pidfds for
    release()); a vanished process is not an error."""
    results, fds = {}, []
    for pid in pids:
        fd = None
        try:
            fd = os.pidfd_open(pid)
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            results[pid] = "killed"
        except ProcessLookupError:
            results[pid] = "vanished"
        except OSError as err:
            try:  # a kernel without pidfds
                os.kill(pid, signal.SIGKILL)
                results[pid] = "killed"
            except ProcessLookupError:
                results[pid] = "vanished"
            except OSError:
                results[pid] = f"error: {err.strerror}"
                log(f"kill {pid}: {err.strerror}")
        if fd is not None:
            fds.append(fd)
    return results, fds


def release(fds):
    """Reap the killed processes' memory now (process_mrelease) instead of waiting for each victim
    to exit, which can be slow or stuck in a driver."""
    for fd in fds:
        if MRELEASE:
            MRELEASE(fd, 0)  # best effort: ENOSYS/EINVAL/ESRCH just mean the victim frees it itself
        os.close(fd)


def _mrelease():
    if os.uname().machine not in ("x86_64", "aarch64"):
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    return lambda fd, flags: syscall(448, fd, flags)  # __NR_process_mrelease on both


MRELEASE = _mrelease()
