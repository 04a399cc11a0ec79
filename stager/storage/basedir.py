"""Whether a node-local base directory is safe to stage in, by one rule.

The base is what ``staging.local_dir`` (or ``$STAGER_LOCAL_DIR``,
``$SLURM_TMPDIR``, ``$TMPDIR``, ``/tmp``) names; job directories are made in
it. Staged files are the user's data, and the job directory is removed
wholesale at the end, so another user must not be able to swap it or plant
one. The rule:

* a base that does not exist is created (0700) when its parent exists, and
  refused otherwise (a mistyped path would otherwise fill another disk);
* it must be a directory this user can write in;
* a symbolic link is followed only when root or this user owns the link;
* the directory must belong to this user or to root;
* a world-writable directory must have the sticky bit (as ``/tmp`` has), or
  any user could rename or remove the job directory.
"""

import errno
import os
import pwd
import stat

from ..errors import ConfigError


def _user(uid):
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_base(path, name):
    """Makes sure the base ``path`` exists and passes the rule; raises ``ConfigError`` naming ``name`` if not.

    Args:
        path: The absolute base directory.
        name: Where it came from, for messages (``staging.local_dir``, ``$TMPDIR``, ...).
    """
    me = os.getuid()
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            raise ConfigError(f"{name} {path} does not exist, nor does its parent {parent}: stager creates only "
                              "the last part of a node-local directory; check the path") from None
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigError(f"{name} {path} does not exist and cannot be created: {exc.strerror}") from None
        link = os.lstat(path)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (0, me):
        raise ConfigError(f"{name} {path} is a symbolic link owned by {_user(link.st_uid)}, who could point it "
                          "anywhere; use the directory it names, or a link of your own")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{name} {path} cannot be used: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{name} {path} is not a directory")
    if st.st_uid not in (0, me):
        raise ConfigError(f"{name} {path} belongs to {_user(st.st_uid)}, not to you or root: its owner could "
                          "remove or replace your staged files; use a directory of your own")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise ConfigError(f"{name} {path} is writable by every user but lacks the sticky bit (mode "
                          f"{stat.S_IMODE(st.st_mode):o}): any user could rename or remove the job directory; "
                          "chmod +t it, or use a directory of your own")


def not_writable(exc, path, name):
    """The ``ConfigError`` for a failed ``mkdir`` of a job directory in the base ``path``, or None."""
    if isinstance(exc, PermissionError) or getattr(exc, "errno", None) in (errno.EROFS, errno.EACCES, errno.EPERM):
        return ConfigError(f"{name} {path} is not writable: {exc.strerror}")
    return None
