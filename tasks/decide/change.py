"""What a decision reads and what it returns: the version-stamped snapshot of one task (read by
tasks/engine/snapshot.py) and the Change that the compare-and-set (tasks/engine/cas.py) applies. Values only."""

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, overload

from leases.state import live_at
from tasks.core.lifecycle import OPEN_OPERATION_STATUSES, ChangeKind, NodeStatus, OperationStatus
from tasks.models import Node, Operation, Receipt, Task, TempResource


@dataclass(frozen=True)
class Positions:
    """Where each node of a plan sits in ``Snapshot.nodes``: fixed for a plan version, so made once and shared by
    every snapshot a write derives from the one that read the nodes (a step's cost stays flat in the plan's size)."""

    by_id: dict[int, int]
    by_key: dict[str, int]

    @staticmethod
    def of(nodes: Sequence[Node]) -> "Positions":
        return Positions({n.id: i for i, n in enumerate(nodes)}, {n.key: i for i, n in enumerate(nodes)})


class NodesByKey(Mapping[str, Node]):
    """A snapshot's nodes by key, read through its positions (no dict of its own)."""

    __slots__ = ("_nodes", "_positions")

    def __init__(self, nodes: Sequence[Node], positions: dict[str, int]) -> None:
        self._nodes, self._positions = nodes, positions

    def __getitem__(self, key: str) -> Node:
        return self._nodes[self._positions[key]]

    def __contains__(self, key: object) -> bool:
        return key in self._positions

    def __iter__(self) -> Iterator[str]:
        return iter(self._positions)

    def __len__(self) -> int:
        return len(self._positions)


class PlanNodes(Sequence[Node]):
    """A snapshot's nodes after writes: the nodes as read, with the ones written since laid over them by position —
    a write copies the nodes it changed, never the plan — folded into one tuple once ``FOLD_AT`` are laid over (so a
    step's cost stays flat in the plan's size, and so does a lookup)."""

    __slots__ = ("_base", "_over")
    FOLD_AT = 256

    def __init__(self, base: Sequence[Node], over: dict[int, Node] | None = None) -> None:
        self._base, self._over = base, over or {}

    def __len__(self) -> int:
        return len(self._base)

    @overload
    def __getitem__(self, index: int) -> Node: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Node, ...]: ...
    def __getitem__(self, index: int | slice) -> Node | tuple[Node, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        if index < 0:
            index += len(self._base)
        node = self._over.get(index)
        return node if node is not None else self._base[index]

    def __iter__(self) -> Iterator[Node]:
        if not self._over:
            return iter(self._base)
        over = self._over
        return (over.get(position, node) for position, node in enumerate(self._base))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # a sequence of mutable rows

    def replaced(self, changed: dict[int, Node]) -> "PlanNodes":
        """These nodes with ``changed`` (position → node) laid over them."""
        over = {**self._over, **changed}
        if len(over) < self.FOLD_AT:
            return PlanNodes(self._base, over)
        folded = list(self._base)
        for position, node in over.items():
            folded[position] = node
        return PlanNodes(tuple(folded))


@dataclass(frozen=True)
class Snapshot:
    task: Task  # the row at ``version``
    nodes: Sequence[Node]  # the current plan's nodes by position; ``node.retries`` = its rejected operations
    unsettled: tuple[Operation, ...]  # intent, dispatched, accepted and unknown operations, oldest first
    now: datetime  # the database clock when it was read (or last written)
    lease_expires_at: datetime | None = None  # the caller's lease, if it is the open one at its epoch
    reserved_for: str = ""  # the operator a takeover is reserved for
    # Derived from ``nodes``, made when first asked and handed on by a write (tasks.engine.snapshot.after_write).
    known_positions: Positions | None = field(default=None, compare=False, repr=False)
    # Every node before this position has succeeded: a lower bound, advanced when asked (``succeeded_before``).
    succeeded_from: int = field(default=0, compare=False, repr=False)

    @property
    def version(self) -> int:
        return self.task.version

    @property
    def positions(self) -> Positions:
        if self.known_positions is None:
            object.__setattr__(self, "known_positions", Positions.of(self.nodes))
        return self.known_positions  # type: ignore[return-value]  # set just above

    @property
    def by_key(self) -> NodesByKey:
        return NodesByKey(self.nodes, self.positions.by_key)

    def node(self, key: str) -> Node | None:
        position = self.positions.by_key.get(key)
        return self.nodes[position] if position is not None else None

    def node_by_id(self, node_id: int) -> Node | None:
        position = self.positions.by_id.get(node_id)
        return self.nodes[position] if position is not None else None

    def nodes_from(self, position: int) -> Iterator[Node]:
        """The nodes from ``position`` on, without walking the ones before it."""
        nodes = self.nodes
        return (nodes[i] for i in range(position, len(nodes)))

    def succeeded_before(self) -> int:
        """The position of the first node that has not succeeded (``len(nodes)`` when all have): a step starts its
        search for the next ready node there, not at the plan's first node."""
        position, nodes = self.succeeded_from, self.nodes
        while position < len(nodes) and nodes[position].status == NodeStatus.SUCCEEDED:
            position += 1
        object.__setattr__(self, "succeeded_from", position)
        return position

    def operation(self, op_key: str) -> Operation | None:
        return next((op for op in self.unsettled if op.op_key == op_key), None)

    def open_operations(self) -> list[Operation]:
        """Dispatched, accepted or unknown: settled only by a query by op key (safe handover)."""
        return [op for op in self.unsettled if op.status in OPEN_OPERATION_STATUSES]

    def intents(self) -> list[Operation]:
        return [op for op in self.unsettled if op.status == OperationStatus.INTENT]

    def succeeded(self) -> set[str]:
        return {n.key for n in self.nodes if n.status == NodeStatus.SUCCEEDED}

    def lease_live(self) -> bool:
        return self.lease_expires_at is not None and live_at(self.lease_expires_at, self.now)


@dataclass(frozen=True)
class AtCommit:
    """A time the change cannot know: the database time of the write, plus ``offset``. The compare-and-set puts
    the value in (a decision is pure: it never reads a clock)."""

    offset: timedelta = timedelta(0)


@dataclass
class Change:
    event: str
    kind: ChangeKind = ChangeKind.SETTLE
    task: dict[str, Any] = field(default_factory=dict)
    # (row, fields) pairs: unsaved rows are inserted, saved ones updated if their status is still the one read.
    nodes: list[tuple[Node, dict[str, Any]]] = field(default_factory=list)
    operations: list[tuple[Operation, dict[str, Any]]] = field(default_factory=list)
    receipts: list[Receipt] = field(default_factory=list)  # inserted; their operation is in ``operations``
    temp_resources: list[TempResource] = field(default_factory=list)  # inserted unless already registered
    data: dict[str, Any] = field(default_factory=dict)
    # Conditions on the task row besides version and status (keys of TASK_CONDITIONS).
    requires: dict[str, Any] = field(default_factory=dict)
    # Node conditions: node pk → (field lookup → value), e.g. {"attempts__lt": F("max_attempts")}.
    node_requires: dict[int, dict[str, Any]] = field(default_factory=dict)
    # A plan's acceptance: the nodes it inserts and the task's input refs derive from the plan document whose digest
    # ``data`` names, so its event lists neither (tasks.engine.events, the fold).
    derived: bool = False
