"""Rendezvous placement: the same set everywhere, little movement on a membership change."""

import random

from replication.placement import ranked, replicas_for, weight


def test_every_node_computes_the_same_set_whatever_order_it_sees_members_in():
    members = ["n1", "n2", "n3", "n4", "n5"]
    rng = random.Random(7)
    for i in range(200):
        cid = f"client-{i}"
        shuffled = members[:]
        rng.shuffle(shuffled)
        assert replicas_for(cid, "n1", shuffled, 3) == replicas_for(cid, "n1", members, 3)


def test_the_owner_is_never_its_own_replica_and_the_count_includes_it():
    for i in range(100):
        chosen = replicas_for(f"c{i}", "n2", ["n1", "n2", "n3"], 2)
        assert len(chosen) == 1 and chosen[0] != "n2"
    assert replicas_for("c", "n1", ["n1", "n2", "n3"], 1) == []
    # Fewer members than copies: every other member, no more.
    assert sorted(replicas_for("c", "n1", ["n1", "n2"], 3)) == ["n2"]


def test_the_weight_is_a_fixed_function_not_the_process_string_hash():
    # A literal: a change of hash would move every session of a running cluster.
    assert weight("sensor-1", "node-a") == weight("sensor-1", "node-a")
    assert weight("sensor-1", "node-a") != weight("sensor-1", "node-b")
    assert weight("a", "b") == 0xFFC151170352BAA3  # the same in every process (PYTHONHASHSEED plays no part)


def test_a_fourth_node_moves_about_a_quarter_of_the_replicas():
    """3 -> 4 members, 2 copies (owner + 1 replica), ranked among all members: the new
    member takes a quarter of the top-2 places and nothing else moves."""
    ids = [f"client-{i}" for i in range(20_000)]
    before = {cid: set(ranked(cid, ["n1", "n2", "n3"])[:2]) for cid in ids}
    after = {cid: set(ranked(cid, ["n1", "n2", "n3", "n4"])[:2]) for cid in ids}
    moved = sum(len(after[cid] - before[cid]) for cid in ids)
    fraction = moved / (2 * len(ids))
    assert 0.23 < fraction < 0.27
    # Only the newcomer gains copies: no shuffling among the old members.
    assert all(after[cid] - before[cid] <= {"n4"} for cid in ids)
