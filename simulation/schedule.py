"""A cluster workload from one seed: who connects where, publishes what, and which
faults hit the cluster when.

`make_schedule(spec)` draws everything from one `random.Random(seed)` before the run
starts, so a seed names a schedule (the same seed, the same plan; the run then replays
it exactly, since everything else in the simulation is deterministic too).  The plan is
plain data: per client a list of timed `ClientStep`s, and one list of timed `WorldStep`s
(kills, restarts, cuts, heals, clock skews, cluster config changes).  Every fault ends
before `spec.seconds`; the run then heals what is left and waits through a quiet period
(`simulation.cluster_sim`).

Clients come in three roles:

- publishers (`p*`): QoS 0/1/2 publishes on `t/0`..`t/3`, one at a time (a QoS >= 1
  publish waits for its acknowledgement), and now and then a reconnect to another node;
- persistent subscribers (`s*`): clean_start=False with a session expiry (most far
  beyond the run, a few short enough to expire while offline), QoS 1/2 subscriptions,
  going offline and coming back on another node (session handoff);
- clean subscribers (`c*`): clean sessions that subscribe afresh on every connection.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

TOPICS = ("t/0", "t/1", "t/2", "t/3")
FILTERS = ("t/#", "t/+", "t/0", "t/1", "t/2", "t/3")
LONG_EXPIRY = 3600
SHORT_EXPIRY = 8  # some persistent sessions expire while their client is away
QUIET_SECONDS = 40.0  # after the final heal: gossip (push-pull every 30 s), anti-entropy, held replay and merges settle
FIRST_FAULT_AT = 3.0


@dataclass(frozen=True, slots=True)
class SimSpec:
    nodes: int = 5
    clients: int = 20
    seconds: float = 60.0
    seed: int = 1
    replicas: int = 1  # session_replicas of every node
    crash: bool = False  # one node crashes for good (never restarted, its disk gone) at a random time


@dataclass(frozen=True, slots=True)
class ClientPlan:
    client_id: str
    role: str  # "publisher", "persistent", "clean"
    expiry: int  # session expiry for persistent subscribers, else 0
    filters: tuple[tuple[str, int], ...]  # (filter, QoS) subscribed on every new session
    nodes: tuple[str, ...]  # the nodes it prefers, in order (the first alive one is used)


@dataclass(frozen=True, slots=True)
class ClientStep:
    at: float
    action: str  # "publish", "reconnect" (go away, come back elsewhere after `pause`)
    topic: str = ""
    qos: int = 0
    pause: float = 0.0
    node: str = ""  # where to reconnect
    how: str = "disconnect"  # how the old connection ends: "disconnect" or "drop"


@dataclass(frozen=True, slots=True)
class WorldStep:
    at: float
    action: str  # "kill", "restart", "cut", "cut_one_way", "heal", "skew", "config", "crash" (for good)
    node: str = ""
    other: str = ""  # the far side of a cut
    key: str = ""
    value: int = 0
    seconds: float = 0.0  # skew


@dataclass
class Schedule:
    spec: SimSpec
    clients: list[ClientPlan] = field(default_factory=list)
    steps: dict[str, list[ClientStep]] = field(default_factory=dict)
    world: list[WorldStep] = field(default_factory=list)


def node_ids(n: int) -> list[str]:
    return [f"n{i}" for i in range(n)]


def make_schedule(spec: SimSpec) -> Schedule:
    rng = random.Random(spec.seed)
    nodes = node_ids(spec.nodes)
    schedule = Schedule(spec)
    publishers = max(1, spec.clients * 2 // 5)
    subscribers = spec.clients - publishers
    persistent = (subscribers + 1) // 2
    for i in range(spec.clients):
        if i < publishers:
            client_id, role = f"p{i}", "publisher"
        elif i < publishers + persistent:
            client_id, role = f"s{i - publishers}", "persistent"
        else:
            client_id, role = f"c{i - publishers - persistent}", "clean"
        order = nodes[:]
        rng.shuffle(order)
        expiry = 0
        filters: tuple[tuple[str, int], ...] = ()
        if role != "publisher":
            picked = rng.sample(FILTERS, rng.choice((1, 1, 2)))
            low = 1 if role == "persistent" else 0
            filters = tuple(sorted((f, rng.randint(low, 2)) for f in picked))
        if role == "persistent":
            expiry = SHORT_EXPIRY if rng.random() < 0.2 else LONG_EXPIRY
        schedule.clients.append(ClientPlan(client_id, role, expiry, filters, tuple(order)))
        schedule.steps[client_id] = _client_steps(rng, spec, role, nodes)
    schedule.world = _world_steps(rng, spec, nodes)
    if spec.crash and spec.seconds > FIRST_FAULT_AT + 4.0:
        # Drawn apart, so a seed's other steps are the same with and without the crash.
        crash_rng = random.Random(f"{spec.seed}:crash")
        at = crash_rng.uniform(FIRST_FAULT_AT + 1.0, spec.seconds * 0.6)
        schedule.world = _before_crash(schedule.world, at)
        schedule.world.append(WorldStep(at, "crash", node=crash_rng.choice(nodes)))
        schedule.world.sort(key=lambda s: s.at)
    return schedule


def _client_steps(rng: random.Random, spec: SimSpec, role: str, nodes: list[str]) -> list[ClientStep]:
    steps: list[ClientStep] = []
    t = rng.uniform(0.5, 1.5)  # after the first connects
    next_reconnect = rng.uniform(4.0, 20.0)
    while t < spec.seconds:
        if t >= next_reconnect:
            pause = rng.uniform(0.2, 3.0) if rng.random() < 0.7 else rng.uniform(4.0, 12.0)
            steps.append(ClientStep(t, "reconnect", pause=pause, node=rng.choice(nodes),
                                    how="drop" if rng.random() < 0.3 else "disconnect"))
            t += pause
            next_reconnect = t + rng.uniform(5.0, 25.0)
            continue
        if role == "publisher":
            qos = rng.choices((0, 1, 2), (2, 5, 3))[0]
            steps.append(ClientStep(t, "publish", topic=rng.choice(TOPICS), qos=qos))
            t += rng.uniform(0.1, 1.2)
        else:
            t = next_reconnect
    return steps


CRASH_CLEAR = 5.0  # in a run with a crash for good, every other fault is undone this long before it


def _before_crash(steps: list[WorldStep], crash_at: float) -> list[WorldStep]:
    """One node crash and nothing else down: the kills and cuts (each up to its
    restart or heal) that are not undone `CRASH_CLEAR` before the crash are left out
    (a cut or a second node down with the crash is a second failure: what one node
    held for a cut-off member, or the only live copy, goes with it); skews and config
    changes stay."""
    kept: list[WorldStep] = []
    episode: list[WorldStep] = []
    for step in steps:
        if step.action in ("kill", "cut", "cut_one_way"):
            episode.append(step)
        elif step.action in ("restart", "heal"):
            if step.at < crash_at - CRASH_CLEAR:
                kept.extend(episode)
                kept.append(step)
            episode = []
        else:
            kept.append(step)
    return kept


def _world_steps(rng: random.Random, spec: SimSpec, nodes: list[str]) -> list[WorldStep]:
    """Faults, spread over the run so that at most one node is down at a time and every
    fault is undone before `spec.seconds`."""
    steps: list[WorldStep] = []
    end = spec.seconds - 2.0
    if len(nodes) < 2 or end <= FIRST_FAULT_AT:
        return steps
    t = FIRST_FAULT_AT + rng.uniform(0.0, 3.0)
    while t < end:
        kind = rng.choices(("kill", "cut", "cut_one_way", "skew", "config", "none"), (3, 3, 2, 1, 2, 2))[0]
        length = rng.uniform(2.0, 10.0)
        if t + length > end:
            length = end - t
        if kind == "kill":
            node = rng.choice(nodes)
            steps.append(WorldStep(t, "kill", node=node))
            steps.append(WorldStep(t + length, "restart", node=node))
        elif kind in ("cut", "cut_one_way"):
            a, b = rng.sample(nodes, 2)
            if kind == "cut" and len(nodes) > 2 and rng.random() < 0.5:
                # A split: one side of one or two nodes against the rest.
                side = rng.sample(nodes, rng.randint(1, max(1, (len(nodes) - 1) // 2)))
                for x in side:
                    for y in nodes:
                        if y not in side:
                            steps.append(WorldStep(t, "cut", node=x, other=y))
            else:
                steps.append(WorldStep(t, kind, node=a, other=b))
            steps.append(WorldStep(t + length, "heal"))
        elif kind == "skew":
            steps.append(WorldStep(t, "skew", node=rng.choice(nodes), seconds=rng.choice((-1, 1)) * rng.uniform(0.2, 3.0)))
        elif kind == "config":
            key, value = rng.choice((("max_queued_messages", rng.randint(3, 40)), ("max_inflight", rng.randint(1, 16)),
                                     ("max_queued_messages", 1000), ("max_inflight", 32)))
            steps.append(WorldStep(t, "config", node=rng.choice(nodes), key=key, value=value))
        t += length + rng.uniform(0.5, 4.0)
    steps.sort(key=lambda s: s.at)
    return steps
