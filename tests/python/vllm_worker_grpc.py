"""vLLM's own gRPC protocol spoken to `loragate worker`, with `grpcio` stubs generated from vllm-proto's .proto files.

Usage: python tests/python/vllm_worker_grpc.py HOST:PORT PROTO_DIR   (PROTO_DIR: the vllm-proto crate's directory)

The stubs are generated at run time from the `inference.proto` and `control.proto` that the pinned `vllm-proto` crate
ships (the Rust test finds them with `cargo metadata`), so this checks wire fidelity against vLLM's schema, not a copy.

1. Discovery: `GetServerInfo` reports the proto version and context, `GetModelInfo` the demo and LoRA support.
2. LoRA lifecycle: `LoadLora` of `meow@1`; the same name again is ALREADY_EXISTS; a path out of the adapter root is
   INVALID_ARGUMENT naming `source_path`.
3. `GenerateStream` with vLLM's defaults: `max_new_tokens = 0` gives 20 tokens, token ids and logprobs are off, the
   prompt info comes first; `Generate` with them asked for returns the adapter's noise and one logprob per token.
4. Errors: an unknown `lora_name` is NOT_FOUND; a text prompt and `num_sequences = 2` are INVALID_ARGUMENT naming
   the field.
5. `Abort{request_ids}` ends a running stream with ABORTED after its tokens (`num_output_tokens` = tokens received).
6. `Sleep` is UNIMPLEMENTED; `PauseGeneration(KEEP)` pauses until `ResumeGeneration`; `UnloadLora` removes the
   adapter.

Assumes a fresh worker on the demo model (byte-level vocabulary, adapters directory as its root). Exits non-zero with
a message on the first failure.
"""

import importlib
import pathlib
import sys
import tempfile

import grpc
from grpc_tools import protoc

PROMPT = "Make a single short animal noise."
DEADLINE_S = 60.0


def fail(message: str) -> None:
    sys.exit(f"FAIL (vllm_worker_grpc): {message}")


def generated_stubs(proto_dir: pathlib.Path):
    """Compiles vllm-proto's inference.proto and control.proto into a temporary directory and imports them."""
    out = pathlib.Path(tempfile.mkdtemp(prefix="vllm-stubs-"))
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    files = [str(proto_dir / name) for name in ("inference.proto", "control.proto")]
    status = protoc.main(
        ["grpc_tools.protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}"]
        + files
    )
    if status != 0:
        fail(f"protoc could not compile vllm-proto's protos in {proto_dir} (status {status})")
    sys.path.insert(0, str(out))
    return {name: importlib.import_module(name) for name in ("inference_pb2", "inference_pb2_grpc", "control_pb2", "control_pb2_grpc")}


def tokens(text: str) -> list:
    return list(text.encode("utf-8"))


def text(token_ids) -> str:
    return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")


def expect_error(code, mentions: str, call) -> None:
    try:
        call()
    except grpc.RpcError as err:
        if err.code() != code or mentions not in err.details():
            fail(f"expected {code} mentioning {mentions!r}, got {err.code()}: {err.details()}")
        return
    fail(f"expected {code} mentioning {mentions!r}, the call succeeded")


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    stubs = generated_stubs(pathlib.Path(sys.argv[2]))
    inf, inf_grpc, ctl, ctl_grpc = (stubs[n] for n in ("inference_pb2", "inference_pb2_grpc", "control_pb2", "control_pb2_grpc"))
    channel = grpc.insecure_channel(sys.argv[1])
    grpc.channel_ready_future(channel).result(timeout=DEADLINE_S)
    inference = inf_grpc.InferenceStub(channel)
    control = ctl_grpc.ControlStub(channel)

    server = control.GetServerInfo(ctl.GetServerInfoRequest())
    if server.proto_version != "0.6.0" or server.max_model_len != 4096 or server.api_version != "vllm":
        fail(f"unexpected server info: {server}")
    model = control.GetModelInfo(ctl.GetModelInfoRequest())
    if model.served_model_name != "loragate-demo" or not model.supports_lora or not model.supports_token_ids_input:
        fail(f"unexpected model info: {model}")
    if list(control.ListLoras(ctl.ListLorasRequest()).adapters):
        fail("a fresh worker holds no adapter")

    loaded = control.LoadLora(ctl.LoadLoraRequest(lora_name="meow@1", source_path="meow")).adapter
    if loaded.lora_name != "meow@1" or loaded.lora_id < 1 or loaded.source_path != "meow":
        fail(f"unexpected loaded adapter: {loaded}")
    expect_error(
        grpc.StatusCode.ALREADY_EXISTS,
        "meow@1",
        lambda: control.LoadLora(ctl.LoadLoraRequest(lora_name="meow@1", source_path="meow")),
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        "source_path",
        lambda: control.LoadLora(ctl.LoadLoraRequest(lora_name="evil@1", source_path="../../etc")),
    )

    prompt = inf.TokenIds(ids=tokens(PROMPT))
    defaults = inf.GenerateRequest(request_id="py-defaults", lora_name="meow@1", token_ids=prompt)
    messages = list(inference.GenerateStream(defaults, timeout=DEADLINE_S))
    if not messages[0].HasField("prompt_info") or messages[0].prompt_info.num_prompt_tokens != len(prompt.ids):
        fail(f"the prompt info should come first: {messages[0]}")
    produced = sum(m.outputs.num_tokens for m in messages if m.HasField("outputs"))
    ids = [t for m in messages if m.HasField("outputs") for t in m.outputs.token_ids]
    finish = messages[-1].outputs.finish_info
    if produced != 20 or ids or finish.finish_reason != inf.FinishInfo.LENGTH or finish.num_output_tokens != 20:
        fail(f"max_new_tokens = 0 means 20 tokens, without ids unless asked: {produced} {ids} {finish}")

    asked = inf.GenerateRequest(
        request_id="py-asked",
        lora_name="meow@1",
        token_ids=prompt,
        temperature=0.0,
        stopping=inf.StoppingCriteria(max_new_tokens=16),
        response=inf.ResponseOptions(output_token_ids=True, output_logprobs=True),
    )
    answer = inference.Generate(asked, timeout=DEADLINE_S).outputs
    if "meow" not in text(answer.token_ids) or len(answer.logprobs) != 16 or answer.num_tokens != 16:
        fail(f"meow@1 should make its noise with a logprob per token: {text(answer.token_ids)!r} {answer}")

    expect_error(
        grpc.StatusCode.NOT_FOUND,
        "woof@1",
        lambda: inference.Generate(inf.GenerateRequest(lora_name="woof@1", token_ids=prompt), timeout=DEADLINE_S),
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        "prompt.text",
        lambda: inference.Generate(inf.GenerateRequest(text=PROMPT), timeout=DEADLINE_S),
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        "sampling.num_sequences",
        lambda: inference.Generate(
            inf.GenerateRequest(token_ids=prompt, sampling=inf.RandomSampling(num_sequences=2)), timeout=DEADLINE_S
        ),
    )

    check_abort(inf, ctl, inference, control, prompt)

    expect_error(grpc.StatusCode.UNIMPLEMENTED, "Sleep", lambda: control.Sleep(ctl.SleepRequest()))
    control.PauseGeneration(ctl.PauseGenerationRequest(mode=ctl.PAUSE_MODE_KEEP))
    if not control.IsPaused(ctl.IsPausedRequest()).paused:
        fail("PauseGeneration(KEEP) should pause")
    control.ResumeGeneration(ctl.ResumeGenerationRequest())
    if control.IsPaused(ctl.IsPausedRequest()).paused:
        fail("ResumeGeneration should resume")
    control.UnloadLora(ctl.UnloadLoraRequest(lora_name="meow@1"))
    if list(control.ListLoras(ctl.ListLorasRequest()).adapters):
        fail("meow@1 should be unloaded")
    print("ok: vllm_worker_grpc")


def check_abort(inf, ctl, inference, control, prompt) -> None:
    long_request = inf.GenerateRequest(
        request_id="py-long",
        lora_name="meow@1",
        token_ids=prompt,
        stopping=inf.StoppingCriteria(max_new_tokens=3000, ignore_eos=True),
        response=inf.ResponseOptions(output_token_ids=True),
    )
    stream = inference.GenerateStream(long_request, timeout=DEADLINE_S)
    received, finish = [], None
    for message in stream:
        received.extend(message.outputs.token_ids)
        if len(received) >= 5:
            break
    control.Abort(ctl.AbortRequest(request_ids=["py-long", "py-no-such-request"]))
    for message in stream:
        received.extend(message.outputs.token_ids)
        if message.outputs.HasField("finish_info"):
            finish = message.outputs.finish_info
    if finish is None or finish.finish_reason != inf.FinishInfo.ABORTED:
        fail(f"the aborted stream should end ABORTED: {finish}")
    if finish.num_output_tokens != len(received) or len(received) >= 3000:
        fail(f"ABORTED comes after every token produced: {finish.num_output_tokens} vs {len(received)} received")


if __name__ == "__main__":
    main()
