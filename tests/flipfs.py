"""A read-only FUSE passthrough whose odd-numbered opens of a file, up to ``--bad-opens``, read one byte flipped.

It stands for a read path that returns other bytes than those stored (a
flaky network file system, a bad cable) while the file's size and times stay
as they are: what only a content hash can catch. Used by tests/test_torn.py:
``python tests/flipfs.py ROOT MNT --bad-opens N --ready-fd FD``.
"""

import argparse
import os
import threading


def main():
    import mfusepy

    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("mountpoint")
    parser.add_argument("--bad-opens", type=int, default=1)
    parser.add_argument("--ready-fd", type=int)
    args = parser.parse_args()
    opens, lock = {}, threading.Lock()

    class Flip(mfusepy.Operations):
        use_ns = True

        def init(self, path):
            os.write(args.ready_fd, b"ready\n")
            os.close(args.ready_fd)

        def getattr(self, path, fh=None):
            st = os.lstat(os.path.join(args.root, path.lstrip("/")))
            return {k.replace("_ns", ""): getattr(st, k) for k in
                    ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime_ns", "st_mtime_ns",
                     "st_ctime_ns")}

        def readdir(self, path, fh):
            return [".", ".."] + os.listdir(os.path.join(args.root, path.lstrip("/")))

        def open(self, path, flags):
            with lock:
                opens[path] = opens.get(path, 0) + 1
                bad = opens[path] <= args.bad_opens and opens[path] % 2 == 1
            fd = os.open(os.path.join(args.root, path.lstrip("/")), os.O_RDONLY)
            return fd | (1 << 30) if bad else fd  # the handle remembers whether this open reads badly

        def read(self, path, size, offset, fh):
            data = os.pread(fh & ~(1 << 30), size, offset)
            if fh & (1 << 30) and offset == 0 and data:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            return data

        def release(self, path, fh):
            os.close(fh & ~(1 << 30))
            return 0

    # direct_io: every read reaches this process, so no page cache hides a bad open.
    mfusepy.FUSE(Flip(), args.mountpoint, foreground=True, ro=True, direct_io=True, attr_timeout=3600,
                 max_threads=8)


if __name__ == "__main__":
    main()
