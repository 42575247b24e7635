"""Helpers shared by the framework-compatibility scripts (compat_*.py): checks that fail with a message, JSON posts,
requests in the background, polls with a deadline, /metrics reads, and the per-adapter pause used to abort requests.

Every script sends the request bodies its framework's client code sends (framework-clients.md) and reads exactly
the fields that code reads, against the demo model: base model `loragate-demo`, adapters `meow` and `woof`,
byte-level vocabulary, EOS 257.
"""

import math
import re
import sys
import threading
import time

import httpx

PROMPT = "Make a single short animal noise."
P = list(PROMPT.encode())
P2 = list(b"Once upon a time")
EOS = 257
BASE = "loragate-demo"
POLL_DEADLINE_S = 60.0


class Failure(Exception):
    """A failed check."""


def check(condition, message):
    if not condition:
        raise Failure(message)


def run(name, main):
    """Runs `main(base_url)`, printing `ok: name` or failing with the first failed check; `meow` is always resumed
    on the way out, so a failure leaves the shared server open for the next script."""
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} BASE_URL")
    base = sys.argv[1].rstrip("/")
    try:
        main(base)
    except Failure as failure:
        sys.exit(f"FAIL ({name}): {failure}")
    finally:
        httpx.post(base + "/skyrl/v1/resume_lora_requests", json={"lora_name": "meow"}, timeout=30)
    print(f"ok: {name}")


def post(client, path, body=None, status=200, **kwargs):
    """POSTs `body` as JSON (or nothing), checks the status, returns the parsed JSON (or None for an empty body)."""
    response = client.post(path, json=body, **kwargs) if body is not None else client.post(path, **kwargs)
    check(response.status_code == status, f"{path} {body}: HTTP {response.status_code}: {response.text[:500]}")
    return response.json() if response.content else None


def get(client, path, status=200):
    response = client.get(path)
    check(response.status_code == status, f"GET {path}: HTTP {response.status_code}: {response.text[:500]}")
    return response.json() if response.content else None


def finite_logprob(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value != -9999.0


class Background(threading.Thread):
    """A POST running in the background (a rollout while its adapter is paused or aborted)."""

    def __init__(self, base, path, body, headers=None):
        super().__init__(daemon=True)
        self.base, self.path, self.body, self.headers = base, path, body, headers or {}
        self.status = self.answer = self.error = None
        self.start()

    def run(self):
        try:
            with httpx.Client(base_url=self.base, timeout=300) as client:
                response = client.post(self.path, json=self.body, headers=self.headers)
                self.status, self.answer = response.status_code, response.json()
        except Exception as err:  # reported by result()
            self.error = err

    def result(self, timeout=60):
        self.join(timeout)
        check(not self.is_alive(), f"{self.path} did not answer within {timeout} s")
        check(self.error is None, f"{self.path} failed: {self.error!r}")
        check(self.status == 200, f"{self.path}: HTTP {self.status}: {self.answer}")
        return self.answer


def poll(what, condition):
    deadline = time.monotonic() + POLL_DEADLINE_S
    while not condition():
        check(time.monotonic() < deadline, f"timed out waiting until {what}")
        time.sleep(0.01)


def metric(client, name, adapter):
    """The value of `name{adapter="..."}` in /metrics (summed over other labels), 0 if absent."""
    pattern = re.compile(r"^" + re.escape(name) + r"\{([^}]*)\} (\S+)$")
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        match = pattern.match(line)
        if match and f'adapter="{adapter}"' in match.group(1).split(","):
            total += float(match.group(2))
    return total


def abort_while_running(client, background, adapter="meow"):
    """Waits until `background` is generating on `adapter`, then pauses and aborts the adapter; returns the report."""
    before = metric(client, "loragate_generated_tokens_total", adapter)
    poll(
        f"a request on {adapter} is generating",
        lambda: metric(client, "loragate_in_flight", adapter) >= 1
        and metric(client, "loragate_generated_tokens_total", adapter) > before,
    )
    check(background.is_alive(), "the request finished before it could be aborted")
    return post(client, "/skyrl/v1/abort_lora_requests", {"lora_name": adapter})


def resume(client, adapter="meow"):
    post(client, "/skyrl/v1/resume_lora_requests", {"lora_name": adapter})


def wait_held(client, adapter="meow", count=1):
    poll(f"{count} request(s) held at {adapter}'s gate", lambda: metric(client, "loragate_held", adapter) == count)
