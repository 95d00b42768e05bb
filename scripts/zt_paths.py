"""Output paths of the scripts, by the train binary's rules (src/runtime/output_path.h):

  - a new path, or an existing regular file (replaced by a rename); a symlink is written through to
    its regular-file target; devices, FIFOs, sockets, directories and dangling links are refused;
  - never one of the command's inputs (same st_dev/st_ino), nor inside an input directory, nor
    another output of the same command; a directory the command replaces whole never holds an
    input (scripts/compare registers each plan and every plan its "extends" chain names);
  - the directory that will hold it (or its nearest existing ancestor) accepts a new file, found by
    creating and removing a probe file.

Every refusal is an OutputError with one line that names the option and the path and says what to
do; the scripts print it as "error: ..." and exit 1. Files are written by write_by_rename: a
temporary file of ours beside the output (created exclusively, it never replaces anything), renamed
over it at the end, removed on failure.
"""
import os
import stat
import tempfile


class OutputError(Exception):
    pass


def _kind(mode):
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _identity(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _existing_dir(label, path, target):
    d = os.path.dirname(os.path.abspath(target))
    while True:
        try:
            st = os.stat(d)
        except FileNotFoundError:
            d = os.path.dirname(d)
            continue
        except OSError as e:
            raise OutputError(f"{label}: cannot use {d} (for {path}): {e.strerror}")
        if not stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{label}: {d} is not a directory (in {path})")
        return d


def _probe(label, path, d):
    try:
        fd, probe = tempfile.mkstemp(prefix=".zt_probe_", dir=d)
    except OSError as e:
        raise OutputError(f"{label}: cannot create files in {d} (for {path}): {e.strerror}; choose another path")
    os.close(fd)
    os.unlink(probe)


class Outputs:
    """The inputs and outputs of one command, checked together before any work starts."""

    def __init__(self):
        self.inputs = []   # (label, path, (dev, ino), is_dir)
        self.outputs = {}  # identity or real path -> label

    def input(self, label, path):
        try:
            st = os.stat(path)
        except OSError:
            return
        self.inputs.append((label, path, (st.st_dev, st.st_ino), stat.S_ISDIR(st.st_mode)))

    def _check_inputs(self, label, path, target, is_dir_output=False):
        real = os.path.realpath(target)
        own = _identity(real)
        a = real
        while True:
            ident = _identity(a)
            if ident is not None:
                is_self = own is not None and a == real
                for in_label, in_path, in_ident, in_dir in self.inputs:
                    if in_ident != ident or not (is_self or in_dir):
                        continue
                    where = "" if is_self else "inside "
                    raise OutputError(f"{label}: {path} is {where}one of this command's inputs ({in_label}: {in_path}); "
                                      f"write it elsewhere")
            parent = os.path.dirname(a)
            if parent == a:
                break
            a = parent
        key = own if own is not None else real
        if key in self.outputs:
            raise OutputError(f"{label}: {path} is also where {self.outputs[key]} goes; give each output its own path")
        self.outputs[key] = label

    def file(self, label, path):
        """A file the command writes: returns the path to write (a symlink's target, else path)."""
        if not path:
            raise OutputError(f"{label}: empty path")
        target = path
        try:
            lst = os.lstat(path)
        except FileNotFoundError:
            lst = None
        except OSError as e:
            raise OutputError(f"{label}: {path} cannot be used: {e.strerror}")
        if lst is not None:
            try:
                st = os.stat(path)
            except OSError:
                raise OutputError(f"{label}: {path} is a symlink to {os.readlink(path)} which cannot be reached; "
                                  f"give a new path, or a link to a regular file")
            if stat.S_ISDIR(st.st_mode):
                raise OutputError(f"{label}: {path} is a directory; give the path of a file in it")
            if not stat.S_ISREG(st.st_mode):
                raise OutputError(f"{label}: {path} is not a regular file ({_kind(st.st_mode)}); "
                                  f"give a new path, or a regular file to replace")
            if stat.S_ISLNK(lst.st_mode):
                target = os.path.realpath(path)
        _probe(label, path, _existing_dir(label, path, target))
        self._check_inputs(label, path, target)
        return target

    def replaced(self, label, path):
        """A directory the command removes and makes anew: none of the inputs may be inside it."""
        real = os.path.realpath(path)
        for in_label, in_path, _, _ in self.inputs:
            r = os.path.realpath(in_path)
            if r == real or r.startswith(real.rstrip(os.sep) + os.sep):
                raise OutputError(f"{label}: {path} would be replaced, and it holds one of this command's inputs "
                                  f"({in_label}: {in_path}); choose another --out, or move that file out first")

    def directory(self, label, path):
        """A directory the command creates (if missing) and writes files into."""
        if not path:
            raise OutputError(f"{label}: empty path")
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise OutputError(f"{label}: {path} cannot be used: {e.strerror}")
        if st is not None and not stat.S_ISDIR(st.st_mode):
            what = "a regular file" if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)
            raise OutputError(f"{label}: {path} is {what}, not a directory; give a directory or a new path")
        d = path if st is not None else _existing_dir(label, path, os.path.join(path, "x"))
        _probe(label, path, d)
        self._check_inputs(label, path, path)
        return path


def write_by_rename(label, path, write, binary=False):
    """Calls write(f) on a new temporary file of ours beside `path` (text, or binary), then renames
    it over `path`; `path` is checked again first (it may have changed while the command ran)."""
    d = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp.", dir=d)
    except OSError as e:
        raise OutputError(f"{label}: cannot create a temporary file beside {path}: {e.strerror}")
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", newline="")) as f:
            write(f)
    except OSError as e:
        os.unlink(tmp)
        raise OutputError(f"{label}: cannot write {path}: {e.strerror}")
    except BaseException:
        os.unlink(tmp)
        raise
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{label}: {path} changed while this command ran (now {_kind(st.st_mode)}); "
                              f"the result is kept in {tmp}")
    except FileNotFoundError:
        pass
    try:
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise OutputError(f"{label}: cannot rename {tmp} to {path}: {e.strerror}")
