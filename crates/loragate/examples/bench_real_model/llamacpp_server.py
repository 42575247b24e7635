"""llama.cpp's HTTP server (the `xllamacpp` wheel) on a GGUF file, for the `bench_real_model` example: binds 127.0.0.1 on a free
port, prints one JSON ready line ({"event": "ready", "http_addr": "127.0.0.1:PORT"}) and serves until its standard
input is closed (its parent exiting closes it), then stops.

Usage: llamacpp_server.py FILE.gguf --threads 2 --slots 32 --ctx-per-slot 512
"""

import argparse
import json
import sys

import xllamacpp


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--ctx-per-slot", type=int, default=512)
    args = parser.parse_args()
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.n_parallel = args.slots
    params.n_ctx = args.slots * args.ctx_per_slot
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.port = 0
    server = xllamacpp.Server(params)
    address = server.listening_address.removeprefix("http://")
    print(json.dumps({"event": "ready", "http_addr": address}), flush=True)
    sys.stdin.read()
    del server


if __name__ == "__main__":
    main()
