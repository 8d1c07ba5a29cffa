"""A TCP relay for scripts/image/kubelet-operator-e2e.sh: pods reach the test plane's
kube-apiserver, which listens on 127.0.0.1 only, through the `kubernetes` Service's ClusterIP
(an iptables DNAT rule sends it here, on the pod bridge's address; no kube-proxy runs).
TLS passes through untouched: the apiserver's certificate names the ClusterIP.

  api_relay.py LISTEN_IP:PORT TARGET_IP:PORT
"""

import socket
import sys
import threading


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(client, target):
    try:
        upstream = socket.create_connection(target, timeout=5)
        upstream.settimeout(None)
    except OSError:
        client.close()
        return
    threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
    pipe(upstream, client)
    client.close()
    upstream.close()


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    thost, tport = sys.argv[2].rsplit(":", 1)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(64)
    print(f"api_relay: {host}:{port} -> {thost}:{tport}", file=sys.stderr, flush=True)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=serve, args=(client, (thost, int(tport))), daemon=True).start()


if __name__ == "__main__":
    main()
