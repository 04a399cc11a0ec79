"""An S3-compatible server (moto) on a free loopback port, in a child process the caller owns.

Run as ``python -m stager.slows3.server``: prints ``port N`` and serves
until its stdin closes.
"""

import logging
import threading

from .owned import Owned, serve_until_owner_leaves

# moto accepts any credentials; clients still need some to sign requests.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "stager", "AWS_SECRET_ACCESS_KEY": "stager", "AWS_DEFAULT_REGION": "us-east-1"}


class ObjectStore(Owned):
    """moto's S3 server on ``127.0.0.1`` on a free port, for a ``with`` block.

    ``endpoint_url`` is where clients talk to it; ``CREDENTIALS`` are
    variables a client needs in its environment.
    """

    def __init__(self):
        super().__init__(__name__, [], "the moto S3 server")

    @property
    def endpoint_url(self):
        return f"http://127.0.0.1:{self.port}"


def main():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request costs the server CPU
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    serve_until_owner_leaves(server.get_host_and_port()[1])
    threading.Event().wait()


if __name__ == "__main__":
    main()
