"""SkyRL-style per-adapter pause over the loragate HTTP front, with `httpx`, against the demo model.

Usage: python tests/python/http_skyrl_pause.py BASE_URL   (e.g. http://127.0.0.1:8000)

1. A long completion on `meow` is running; `abort_lora_requests` hands it back with finish_reason "abort", its
   partial text and tokens, and lists its X-Request-Id.
2. While `meow` is paused a fresh completion is held at the gate (`loragate_held{adapter="meow"} 1` in /metrics),
   `wait_lora_unpaused` reports paused, and `woof` keeps serving.
3. `resume_lora_requests` releases the held completion, which finishes with "meow"; `wait_lora_unpaused` reports
   open.

Assumes the demo model (adapters `meow` and `woof`, byte-level vocabulary). Exits non-zero with a message on the
first failure, and always resumes `meow` on the way out.
"""

import re
import sys
import threading
import time
import uuid

import httpx

PROMPT = "Make a single short animal noise."
POLL_DEADLINE_S = 60.0


def fail(message: str) -> None:
    sys.exit(f"FAIL (http_skyrl_pause): {message}")


def check(condition: bool, message: str) -> None:
    if not condition:
        fail(message)


class Completion(threading.Thread):
    """A POST /v1/completions running in the background."""

    def __init__(self, base: str, body: dict, request_id: str) -> None:
        super().__init__(daemon=True)
        self.base, self.body, self.request_id = base, body, request_id
        self.status = None
        self.answer = None
        self.error = None

    def run(self) -> None:
        try:
            with httpx.Client(timeout=300) as client:
                response = client.post(
                    self.base + "/v1/completions", json=self.body, headers={"X-Request-Id": self.request_id}
                )
                self.status, self.answer = response.status_code, response.json()
        except Exception as err:  # reported by the main thread
            self.error = err

    def result(self, timeout: float) -> dict:
        self.join(timeout)
        check(not self.is_alive(), f"completion {self.request_id} did not finish within {timeout} s")
        check(self.error is None, f"completion {self.request_id} failed: {self.error!r}")
        check(self.status == 200, f"completion {self.request_id}: HTTP {self.status}: {self.answer}")
        return self.answer


def metric(client: httpx.Client, name: str, adapter: str) -> float:
    """The value of `name{adapter="..."}` in /metrics (summed over other labels), 0 if absent."""
    text = client.get("/metrics").text
    pattern = re.compile(r"^" + re.escape(name) + r"\{([^}]*)\} (\S+)$")
    total = 0.0
    for line in text.splitlines():
        match = pattern.match(line)
        if match and f'adapter="{adapter}"' in match.group(1).split(","):
            total += float(match.group(2))
    return total


def poll(what: str, condition) -> None:
    deadline = time.monotonic() + POLL_DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            fail(f"timed out waiting until {what}")
        time.sleep(0.02)


def post_ok(client: httpx.Client, path: str, body: dict) -> dict:
    response = client.post(path, json=body)
    check(response.status_code == 200, f"{path} {body}: HTTP {response.status_code}: {response.text}")
    return response.json()


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} BASE_URL")
    base = sys.argv[1].rstrip("/")
    with httpx.Client(base_url=base, timeout=120) as client:
        try:
            run(base, client)
        finally:
            client.post("/skyrl/v1/resume_lora_requests", json={"lora_name": "meow"})
    print("ok: http_skyrl_pause")


def run(base: str, client: httpx.Client) -> None:
    # 1. Abort a running completion.
    tokens_before = metric(client, "loragate_generated_tokens_total", "meow")
    long_id = f"skyrl-long-{uuid.uuid4().hex[:8]}"
    long = Completion(
        base,
        {"model": "meow", "prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True, "temperature": 0},
        long_id,
    )
    long.start()
    poll(
        "the long completion is running and has produced tokens",
        lambda: metric(client, "loragate_in_flight", "meow") >= 1
        and metric(client, "loragate_generated_tokens_total", "meow") > tokens_before,
    )
    check(long.is_alive(), "the long completion finished before it could be aborted")
    report = post_ok(client, "/skyrl/v1/abort_lora_requests", {"lora_name": "meow"})
    check(report.get("status") == "ok", f"abort: {report}")
    check(long_id in report.get("aborted", []), f"abort should list {long_id}: {report}")
    check(report.get("count") == len(report.get("aborted", [])), f"abort count mismatch: {report}")
    aborted = long.result(timeout=30)
    choice = aborted["choices"][0]
    check(choice["finish_reason"] == "abort", f"the aborted completion's finish_reason: {choice['finish_reason']!r}")
    check(choice["token_ids"] and choice["text"], f"the aborted completion should keep its partial output: {choice}")
    check(len(choice["token_ids"]) < 2000, "an aborted completion cannot have its whole budget")
    check(aborted["id"] == f"cmpl-{long_id}", f"id {aborted['id']!r} should be cmpl-{long_id}")

    # 2. Paused: a fresh completion is held; the adapter reports paused; woof is unaffected.
    held_id = f"skyrl-held-{uuid.uuid4().hex[:8]}"
    held = Completion(base, {"model": "meow", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}, held_id)
    held.start()
    poll('loragate_held{adapter="meow"} is 1', lambda: metric(client, "loragate_held", "meow") == 1)
    check(held.is_alive(), "the completion submitted while paused should be held, but it finished")
    check(metric(client, "loragate_paused", "meow") == 1, "loragate_paused{adapter=\"meow\"} should be 1")
    waited = post_ok(client, "/skyrl/v1/wait_lora_unpaused", {"lora_name": "meow", "timeout_s": 0.2})
    check(waited == {"paused": True}, f"wait_lora_unpaused while paused: {waited}")
    woof = post_ok(client, "/v1/completions", {"model": "woof", "prompt": PROMPT, "max_tokens": 24, "temperature": 0})
    check("woof" in woof["choices"][0]["text"], f"woof should keep serving while meow is paused: {woof}")
    check(held.is_alive(), "the held completion finished while meow was still paused")

    # 3. Resume: the held completion is admitted and finishes.
    resumed = post_ok(client, "/skyrl/v1/resume_lora_requests", {"lora_name": "meow"})
    check(resumed.get("status") == "ok", f"resume: {resumed}")
    released = held.result(timeout=60)
    text = released["choices"][0]["text"]
    check("meow" in text, f"the released completion should say meow: {text!r}")
    check(released["choices"][0]["finish_reason"] in ("stop", "length"), f"released: {released['choices'][0]}")
    waited = post_ok(client, "/skyrl/v1/wait_lora_unpaused", {"lora_name": "meow"})
    check(waited == {"paused": False}, f"wait_lora_unpaused after resume: {waited}")
    check(metric(client, "loragate_held", "meow") == 0, "nothing should be held after resume")


if __name__ == "__main__":
    main()
