"""``Decoders.builds``: board runtimes a backend builds as its own on every board (docs/writing-a-backend.md).
``cannot_build`` answers for them as for ``Decoders.runtimes``; the routing itself (plan and deploy handing the
host's llama.cpp runtime to the llamacpp backend) is tested in plugins/llamacpp/tests/test_deploy.py."""

from __future__ import annotations

from edgeinfer.contract import Backend, Decoders
from edgeinfer.contract.records import Needs


class Builder(Backend):
    name = "builder-under-test"
    decoders = Decoders(schemes=("fp16",), builds={
        "own-rt": None, "needs-rt": Needs("no_such_module_of_edgeinfer", "the thing", "pip install the-thing")})

    def probe(self):
        raise NotImplementedError

    def open_decoder(self, model, device, context, slots, **options):
        raise NotImplementedError

    def convert_decoder(self, model, scheme, context, out, calibration=None, **options):
        raise NotImplementedError


def test_a_runtime_a_backend_builds_as_its_own_is_buildable_unless_it_needs_more():
    assert Builder.cannot_build("decoder") is None
    assert Builder.cannot_build("decoder", "own-rt") is None
    assert Builder.cannot_build("decoder", "needs-rt") == "the thing is not installed: pip install the-thing"
    assert "builds no decoder models for runtime other-rt" in Builder.cannot_build("decoder", "other-rt")
    assert Builder.cannot_build("encoder", "own-rt") is not None  # decoders only
