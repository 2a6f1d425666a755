"""The worker's subjects and JetStream names for a namespace, with the
contract's defaults (docs/protocol.md, "Names and defaults")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Subjects:
    """Where a namespace's traffic goes. Override a field with
    ``dataclasses.replace`` when the workers' ``subjects.*`` keys are set."""

    prefill_results: str
    gen_jobs: str
    ids: str
    cancel: str
    kv_release: str
    dead_letter: str
    prefill_stream: str
    gen_stream: str
    cancel_stream: str

    @classmethod
    def for_namespace(cls, namespace: str = "llm") -> Subjects:
        if not namespace or any(c in namespace for c in " .*>\t\r\n"):
            raise ValueError(
                f"namespace is {namespace!r}; expected one NATS subject token (the workers' "
                "`namespace` key), such as 'llm'"
            )
        upper = namespace.upper()
        return cls(
            prefill_results=f"{namespace}.prefill.results",
            gen_jobs=f"{namespace}.gen.jobs",
            ids=f"{namespace}.handoff.ids",
            cancel=f"{namespace}.handoff.cancel",
            kv_release=f"{namespace}.kv.release",
            dead_letter=f"{namespace}.handoff.dead",
            prefill_stream=f"{upper}_PREFILL",
            gen_stream=f"{upper}_GEN",
            cancel_stream=f"{upper}_CANCEL",
        )
