from pagedgen.engine.sequence import SequenceGroup


class RunningLoRAs:
    """The LoRA adapters the running groups use, which a step's slots must hold: at most
    max_loras of them (None: LoRA is off, anything goes)."""

    def __init__(self, max_loras: int | None, running: list[SequenceGroup]) -> None:
        self.max_loras = max_loras
        self.ids = set() if max_loras is None else {g.lora_int_id for g in running} - {0}

    def admits(self, group: SequenceGroup) -> bool:
        """Whether group may join without one adapter too many."""
        lora_id = group.lora_int_id
        if not lora_id or self.max_loras is None or lora_id in self.ids:
            return True
        return len(self.ids) < self.max_loras

    def add(self, group: SequenceGroup) -> None:
        if group.lora_int_id and self.max_loras is not None:
            self.ids.add(group.lora_int_id)
