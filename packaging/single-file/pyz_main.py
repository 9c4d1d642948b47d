# __main__ of the single-file build (runc-guard.pyz).
#
# Under any name but runc-guardctl this is the shim containerd runs, so it does
# exactly what bin/runc-guard.py does and nothing more: two imports, then main().
# Modules are loaded by the frozen zipimport from precompiled .pyc files next to
# their sources (unchecked-hash pycs: no stat of a source; an interpreter of
# another version falls back to the .py source).
import sys

if sys.argv[0] == "-c":  # run by the file's own prelude: argv[1] is the file as invoked
    del sys.argv[0]
if sys.argv[0].rpartition("/")[2] != "runc-guardctl":
    import _signal

    _noted = []  # SIGTERM/SIGINT/SIGHUP before the shim can act: noted, never a traceback
    for _signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        if _signal.getsignal(_signum) != _signal.SIG_IGN:  # ignored by the caller: the runtime inherits that
            _signal.signal(_signum, lambda signum, _frame: _noted.append(signum))
    from runc_guard.shim.entry import main

    sys.exit(main(_noted))


def _native_path():
    """Extract the bundled extension modules (psutil) once; they cannot load from a zip."""
    import os
    import zipfile

    archive = sys.path[0]
    with zipfile.ZipFile(archive) as zf:
        names = [n for n in zf.namelist() if n.startswith("_native/") and not n.endswith("/")]
        if not names:
            return None
        build = zf.read("_native/BUILD").decode().strip()
        base = os.environ.get("RUNC_GUARD_PYZ_CACHE") or (
            "/var/cache/runc-guard/pyz" if os.geteuid() == 0
            else os.path.join(os.path.expanduser("~"), ".cache", "runc-guard", "pyz")
        )
        target = os.path.join(base, build)
        if not os.path.exists(os.path.join(target, ".complete")):
            os.makedirs(base, mode=0o755, exist_ok=True)
            tmp = f"{target}.{os.getpid()}.tmp"
            for name in names:
                zf.extract(name, tmp)
            open(os.path.join(tmp, "_native", ".complete"), "w").close()
            try:
                os.rename(os.path.join(tmp, "_native"), target)
            except OSError:  # another process won the race: use its copy
                pass
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return target


_extracted = _native_path()
if _extracted:
    sys.path.insert(1, _extracted)
from runc_guard.cli import main  # noqa: E402

sys.exit(main())
