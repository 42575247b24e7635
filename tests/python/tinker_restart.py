"""A Tinker SDK future that outlives a `kill -9` of the server (driven by `crates/loragate/tests/restart.rs`).

Usage: python tests/python/tinker_restart.py BASE_URL SAMPLES TOKENS

Submits one greedy sample of `meow` (SAMPLES sequences of exactly TOKENS tokens: nothing stops them earlier) with the
unmodified SDK (`tinker==0.38.0`); the test has paused `meow`, so the future stays pending. Prints `submitted`, then
waits on the future while the test kills the server, starts it again on the same address and state, and resumes
`meow`. Prints `ok: {"tokens": [...], "stop_reasons": [...]}` (tokens per sequence) once the future resolved.
"""

import json
import os
import sys

import tinker
from tinker import types


def main() -> None:
    base_url, samples, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if tinker.__version__ != "0.38.0":
        sys.exit(f"FAIL (tinker_restart): this test pins tinker 0.38.0, found {tinker.__version__}")
    service = tinker.ServiceClient(base_url=base_url, api_key="tml-loragate-test")
    meow = service.create_sampling_client(model_path="tinker://loragate/meow").result()
    future = meow.sample(
        prompt=types.ModelInput.from_ints(list(b"The animal says:")),
        num_samples=samples,
        sampling_params=types.SamplingParams(max_tokens=tokens, temperature=0.0, stop=[]),
    )
    print("submitted", flush=True)
    result = future.result()
    answer = {
        "tokens": [len(sequence.tokens) for sequence in result.sequences],
        "stop_reasons": [str(sequence.stop_reason) for sequence in result.sequences],
    }
    print("ok: " + json.dumps(answer), flush=True)
    # Leave without interpreter finalization (the SDK's pyqwest transport may abort there; see docs/tinker.md).
    os._exit(0)


if __name__ == "__main__":
    main()
