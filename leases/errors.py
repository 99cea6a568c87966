class LeaseError(Exception):
    """Base of every lease refusal. ``code`` is stable and maps to API problems and console messages."""

    code = "lease_error"


class LeaseHeld(LeaseError):
    code = "lease_held"

    def __init__(self, task_id: int, holder: str, expires_at: object) -> None:
        super().__init__(f"task {task_id} is leased by {holder} until {expires_at} (plus grace)")
        self.task_id, self.holder, self.expires_at = task_id, holder, expires_at


class LeaseReserved(LeaseError):
    """A person asked to take the task over: the next grant is theirs."""

    code = "lease_reserved"

    def __init__(self, task_id: int, operator_id: str) -> None:
        super().__init__(f"task {task_id} is reserved for operator {operator_id}, who asked to take it over")
        self.task_id, self.operator_id = task_id, operator_id


class LeaseLost(LeaseError):
    """The caller's epoch is not the task's open lease any more (released, superseded or forced)."""

    code = "lease_lost"

    def __init__(self, task_id: int, epoch: int, detail: str = "") -> None:
        super().__init__(f"lease epoch {epoch} on task {task_id} is no longer valid{': ' + detail if detail else ''}")
        self.task_id, self.epoch = task_id, epoch


class LeaseExpired(LeaseError):
    code = "lease_expired"

    def __init__(self, task_id: int, epoch: int, expires_at: object) -> None:
        super().__init__(f"lease epoch {epoch} on task {task_id} expired at {expires_at}")
        self.task_id, self.epoch, self.expires_at = task_id, epoch, expires_at


class RenewalOutOfOrder(LeaseError):
    code = "renewal_out_of_order"

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(f"renewal carried renewal_seq {expected}, the lease is at {actual}")
        self.expected, self.actual = expected, actual


class LeaseRefused(LeaseError):
    """The task is in a status in which this kind of holder gets no lease (an agent while people hold it)."""

    code = "lease_refused"

    def __init__(self, task_id: int, status: str) -> None:
        super().__init__(f"task {task_id} is {status}: no agent lease is granted in that status")
        self.task_id, self.status = task_id, status
