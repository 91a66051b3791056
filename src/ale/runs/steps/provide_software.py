"""The task's software before the seal (part of PROVISION; a grading probe's own step)."""

from __future__ import annotations

from ale import layout
from ale.layout import Evidence
from ale.runs import software, vm_seal
from ale.runs.state import RunState
from ale.sandbox.base import SandboxError
from ale.sandbox.qemu.image import is_default_guest


async def provide_software(state: RunState) -> None:
    """The task's software before the seal: its environment image, found or built
    on the trusted side from its needs (the staged input's runtime_env included)."""
    base = state.planned_image
    if vm_seal.is_vm(state) and not (state.plan.provision_software and is_default_guest(base)):
        # An operator's own guest or disk runs as given: its software is what it holds.
        state.live.image = base
        raw = state.prep.task.card.raw.get("software")
        declared = [str(x) for x in ([raw] if isinstance(raw, str) else raw if isinstance(raw, list) else [])]
        state.record.store.write_json(Evidence.ENVIRONMENT, {
            "image": base, "kind": "as given", "base": base, "declared": declared,
            "note": "an operator's own VM guest or disk runs as given" if state.plan.provision_software
            else "provision_software is off"})
        if declared:
            state.record.warnings.append(f"software: the VM guest {base} runs as given; its declared software "
                                         f"({', '.join(declared[:8])}) is whatever that guest holds")
        return
    if not state.plan.provision_software:
        state.live.image = base
        state.record.store.write_json(Evidence.ENVIRONMENT, {"image": base, "kind": "as given", "base": base,
                                                              "note": "provision_software is off"})
        return
    if vm_seal.is_vm(state):  # the environment image, made a VM guest of its own
        image, doc = await software.provide_for_vm(state.plan.task_dir, input_dir=state.folder.input_host,
                                                   overlay_path=state.plan.software_overlay, guest=base)
    else:
        image, doc = await software.provide(state.plan.task_dir, input_dir=state.folder.input_host,
                                            overlay_path=state.plan.software_overlay, base_image=base,
                                            image_id=lambda ref: _image_id(state, ref))
    state.live.image = None if doc.get("kind") == "base" else image  # nothing to add: the images as planned
    state.record.store.write_json(Evidence.ENVIRONMENT, doc)
    state.record.environment = {"image": image, "kind": doc.get("kind"), "missing": len(doc.get("missing", []))}
    state.record.events.append("software.provided", image=image, kind=doc.get("kind"),
                               missing=[m.get("name") for m in doc.get("missing", [])])
    if doc.get("missing"):
        names = ", ".join(str(m.get("name")) for m in doc["missing"][:8])
        state.record.warnings.append(f"software: {len(doc['missing'])} declared need(s) not provided ({names}); "
                                     f"see {layout.evidence_path(Evidence.ENVIRONMENT)}")


def _image_id(state: RunState, ref: str) -> str | None:
    try:
        return state.prep.provider.image_inspect(ref).get("Id")
    except SandboxError:
        return None
