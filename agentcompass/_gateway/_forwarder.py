"""Run inside a session: relay TCP connections on 127.0.0.1 to the model gateway's unix socket.

``python3 _forwarder.py SOCKET`` binds a free port on 127.0.0.1, prints
``PORT PID`` on one line, closes its standard output and serves in the
background (process PID) until killed. Standard library only, any Python 3:
it runs on the session's interpreter, not the runtime's.
"""

import os
import socket
import sys
import threading


def pump(source, sink):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def relay(client, path):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main():
    path = sys.argv[1]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    pid = os.fork()
    if pid:
        sys.stdout.write(f"{listener.getsockname()[1]} {pid}\n")
        sys.stdout.flush()
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=relay, args=(client, path), daemon=True).start()


if __name__ == "__main__":
    main()
