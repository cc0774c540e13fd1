"""The matching core of the DETR integrations (lucid_assign.integrations._matching), on its own: which tensors are
layers of a stack, the ragged layout against SciPy's loops, the rule of "same call" of the layer memo (inference
tensors fall back), the refusal's words and order, the cost taken at its copy to the host, and a matcher's settings."""

import threading

import numpy as np
import pytest
import torch

from lucid_assign.integrations import _matching as core

scipy_optimize = pytest.importorskip("scipy.optimize", reason="SciPy is the oracle")


def test_which_tensors_are_layers_of_a_stack():
    """A layer of a stack: ``stack.select(dim, l)`` of a contiguous stack of 2 to MAX_LAYERS layers, sliced along the
    other dims (iterating or indexing (L, B, Q, C) or (B, L, Q, C) outputs), or a contiguous block of a contiguous
    stack (a head's output over the flattened layers); anything else is a call of its own."""
    stack = torch.rand(7, 2, 5, 4)
    assert [core.layer_of(stack[k]).layer for k in range(7)] == list(range(7))
    assert [core.layer_of(t).layer for t in stack] == list(range(7))  # iterating: the peer's loss
    assert core.layer_of(stack[:-1][2]).layer == 2 and core.layer_of(stack[3:][1]).layer == 4
    found = core.layer_of(stack[4])
    assert found.stack is stack and found.layers == 7 and found.step == 40 and found.where == 0
    across = core.layer_of(stack[:, 1])  # a (B, L, Q, C) reading of the same storage: dim 1 has 2 "layers"
    assert (across.layer, across.layers, across.step) == (1, 2, 20)
    sliced = core.layer_of(stack[2, :, 1:])
    assert (sliced.layer, sliced.layers, sliced.where) == (2, 7, 4)
    flat = torch.rand(3 * 2 * 5, 4)  # a head's output over the flattened layers, viewed per layer
    assert core.layer_of(flat.view(3, 2, 5, 4)[1]).layer == 1
    assert core.layer_of(flat[10:20].view(2, 5, 4)).layer == 1
    for other in (stack, stack[2].clone(), stack.transpose(1, 2)[0], torch.rand(core.MAX_LAYERS + 1, 2, 5, 4)[0],
                  torch.rand(1, 2, 5, 4)[0], flat[3:13].view(2, 5, 4), stack[2].view(torch.int32)):
        assert core.layer_of(other) is None

    class Marked(torch.Tensor):
        pass

    assert core.layer_of(stack.as_subclass(Marked)[1]) is None


def test_stacked_views_are_each_layers_view():
    stack = torch.rand(2, 4, 6, 5)  # (B, L, Q, C)
    t = stack[:, 2, 1:]
    every = core.stacked(t, core.layer_of(t))
    assert every.shape == (4, 2, 5, 5)
    assert all(torch.equal(every[k], stack[:, k, 1:]) and every[k].stride() == t.stride() for k in range(4))


def _scipy(cost, counts, groups, per_batch=False):
    """SciPy's loop of the matchers: per query group, per image, on its block of the cross-product cost."""
    per_group = cost.shape[1] // groups
    starts = np.cumsum([0, *counts])
    found = [([], []) for _ in counts]
    for g in range(groups):
        for b, n in enumerate(counts):
            block = cost[b, g * per_group:(g + 1) * per_group, starts[b]:starts[b] + n]
            i, j = scipy_optimize.linear_sum_assignment(block.numpy())
            found[b][0].extend(i + g * per_group)
            found[b][1].extend(j + (starts[b] if per_batch else 0))
    return [(list(i), list(j)) for i, j in found]


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_layout_and_matches_equal_scipys_loops(library, backend):
    """A batch's cross-product cost cut into per-image blocks (and query groups), solved in one call and turned into
    the matchers' index format: each image's matches are SciPy's on its block, ties included, the objects indexed in
    their image or among the batch's."""
    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        counts = torch.randint(0, 8, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
        if sum(counts) == 0:
            continue
        groups = int(torch.randint(1, 4, (1,), generator=g))
        queries = groups * int(torch.randint(1, 7, (1,), generator=g)) + int(torch.randint(0, 2, (1,), generator=g))
        cost = torch.randint(0, 3, (len(counts), queries, sum(counts)), generator=g).double()  # ties everywhere
        where = core.layout(counts, queries, groups, "cpu")
        for per_batch in (False, True):
            got = core.solve_call(core.problems_of_cross_cost(cost, where), where, backend, check=True,
                                  batch_objects=per_batch)
            assert [(i.tolist(), j.tolist()) for i, j in got] == _scipy(cost, counts, groups, per_batch), trial


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_the_matches_op_is_the_python_path(library, device, monkeypatch):
    """torch.ops.lucid.matches (one call: the layers' pairs picked and offset in C++) gives, split per image, what the
    same operations give from Python, for several layers, query groups and the peer's batch-wide object indices; it
    refuses inconsistent arguments; opcheck."""
    g = torch.Generator().manual_seed(1)
    for counts, groups, layers in (([3, 0, 5], 1, 1), ([3, 0, 5], 2, 3), ([1, 4], 3, 2), ([0, 0], 1, 2)):
        queries = 6
        where = core.layout(counts, queries, groups, device)
        problems = torch.rand(layers * len(counts) * groups, queries // groups, where.width, generator=g).to(device)
        rows, cols, _ = core.solve(problems, where, "kernel", layers)
        for per_batch in (False, True):
            ours = core.matches(rows, cols, where, layers, per_batch)
            monkeypatch.setattr(core, "MATCHES_OP_DEVICES", ())
            theirs = core.matches(rows, cols, where, layers, per_batch)
            monkeypatch.undo()
            assert len(ours) == len(theirs) == layers * len(counts)
            assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(ours, theirs))
    op = torch.ops.lucid.matches.default
    rows = torch.zeros(4, 3, dtype=torch.long, device=device)
    pairs = torch.tensor([0, 1, 3], device=device)
    for args, words in (((rows, rows[:, :2], pairs, None, None, 1), "rows and cols must have one shape"),
                        ((rows, rows, pairs, None, None, 5), "layers must be >= 1 and divide"),
                        ((rows, rows, pairs, pairs[:2], None, 1), "query_offset and object_offset must be"),
                        ((rows.float(), rows, pairs, None, None, 1), "must be int64")):
        with pytest.raises((ValueError, TypeError), match=words):
            op(*args)
    torch.library.opcheck(op, (rows, rows, pairs, pairs, None, 2))


def test_pad_objects_is_pad_sequence():
    counts = [2, 0, 3]
    flat = torch.arange(5 * 4, dtype=torch.float32).view(5, 4)
    where = core.layout(counts, 6, 1, "cpu")
    want = torch.nn.utils.rnn.pad_sequence(flat.split(counts), batch_first=True)
    assert torch.equal(core.pad_objects(flat, where), want)


def test_refusals_name_the_first_problem_of_scipys_loop(library):
    """The loop over query groups is outside the loop over images: image 1's group 0 (NaN) comes before image 0's
    group 1 (infeasible), and the error names it with SciPy's words."""
    cost = torch.rand(2, 4, 5)
    cost[0, 2:, :2] = float("inf")
    cost[1, 0, 3] = float("nan")
    where = core.layout([2, 3], 4, 2, "cpu")
    with pytest.raises(ValueError, match=r"^image 1, query group 0: matrix contains invalid numeric entries$"):
        core.solve_call(core.problems_of_cross_cost(cost, where), where, "kernel", check=True)
    one = core.layout([2], 4, 2, "cpu")
    with pytest.raises(ValueError, match=r"^image 0, query group 1: cost matrix is infeasible$"):
        core.solve_call(core.problems_of_cross_cost(cost[:1, :, :2], one), one, "kernel", check=True)
    assert core.solve_call(core.problems_of_cross_cost(cost[:1, :, :2], one), one, "kernel", check=False)


class Matcher:
    """A stand-in for a trainer's matcher: its cost is the L1 of (B, Q, 4) boxes against each image's objects, times
    its gain; ``_costs`` counts the layered costs it computed."""

    alpha = 0.25

    def __init__(self, gain=2.0):
        self.gain = gain
        self._costs = 0

    def costs(self, where, objects):
        def per_layer(stacks):
            self._costs += 1
            boxes = stacks[0]
            padded = core.pad_objects(objects, where)
            layers, bs, nq = boxes.shape[:3]
            cost = self.gain * (boxes[:, :, :, None] - padded[None, :, None]).abs().sum(-1)
            return cost.reshape(layers * bs, nq, -1)

        return per_layer


def _call(m, boxes, objects, counts, backend="reference"):
    where = core.layout(counts, boxes.shape[1], 1, "cpu")
    return core.layered(m, (boxes,), (objects,), where, m.costs(where, objects), backend,
                        check=True)


def _alone(boxes, objects, counts, gain=2.0):
    """The matches of a call of its own, on a copy of its layer."""
    where = core.layout(counts, boxes.shape[1], 1, "cpu")
    cost = Matcher(gain).costs(where, objects)([boxes.clone()[None]])
    return core.solve_call(cost, where, "reference", check=True)


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(i, k) and torch.equal(j, m) for (i, j), (k, m) in zip(a, b))


def test_the_memo_serves_only_the_same_call():
    """The first call on a stack solves every layer; the other layers are served once each, while the stack, the
    objects, the layout and the matcher's settings are the same; otherwise the call is matched afresh. Each call's
    matches are those of a call of its own."""
    g = torch.Generator().manual_seed(1)
    stack, objects, counts = torch.rand(3, 2, 6, 4, generator=g), torch.rand(5, 4, generator=g), [2, 3]
    m = Matcher()
    for k in (2, 0, 1):  # 2 matches all three layers; 0 and 1 are served
        assert _same(_call(m, stack[k], objects, counts), _alone(stack[k], objects, counts))
    assert m._costs == 1
    _call(m, stack[0], objects, counts)  # a layer taken already: a new pass over the stack, layers 1 and 2 kept
    assert m._costs == 2

    def afresh(layer, objects_=objects, counts_=counts, change=lambda: None, gain=2.0):
        """After a call on layer 0 (a new memo) and ``change()``, whether a call on ``layer`` computes the costs
        again; its matches are those of a call of its own either way."""
        core._MEMOS.pop(m, None)
        _call(m, stack[0], objects, counts)
        change()
        before = m._costs
        assert _same(_call(m, layer, objects_, counts_), _alone(layer, objects_, counts_, gain))
        return m._costs == before + 1

    assert not afresh(stack[1])  # the same call: served
    assert afresh(stack[1], change=lambda: stack[1].mul_(0.5))  # in place: the version moves on
    assert afresh(stack[1], objects.flip(0).contiguous())  # other objects
    assert afresh(stack[1], counts_=[3, 2])  # another layout
    assert afresh(stack[1, :, 1:])  # another slice of the layer
    assert afresh(stack[1], change=lambda: setattr(m, "gain", 3.0), gain=3.0)  # another setting


def test_the_loss_calls_named_calls_are_served_by_ticket_by_the_same_rule(monkeypatch):
    """Inside a loss call (loss_call), the first call's memo holds a ticket for each call the loss named; a later call
    on those very inputs is served by its ticket without looking for its stack (no _keyed), under the rule of "same
    call": after any change that rule sees, the call is not served (None: its caller computes it afresh)."""
    g = torch.Generator().manual_seed(5)
    stack, objects, counts = torch.rand(3, 2, 6, 4, generator=g), torch.rand(5, 4, generator=g), [2, 3]
    views = [stack[k] for k in range(3)]
    m = Matcher()
    keyed, plain_keyed = [], core._keyed
    monkeypatch.setattr(core, "_keyed", lambda *a, **k: keyed.append(1) or plain_keyed(*a, **k))

    def served(view, objects_=objects, counts_=counts):
        return core.served(m, (view,), (objects_,), core.layout(counts_, 6, 1, "cpu"), "reference", True)

    def later(change=lambda: None, view=1, region=False, **kw):
        """A new first call (on layer 2), ``change()``, then the call on ``view`` (a layer's index: its named view,
        or a tensor), under bf16 autocast where ``region``: (its matches or None, whether it was served without
        _keyed)."""
        core._MEMOS.pop(m, None)
        _call(m, views[2], objects, counts)
        change()
        keyed.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=region):
            found = served(views[view] if isinstance(view, int) else view, **kw)
        return found, not keyed

    with core.loss_call(m, [(v,) for v in views]):
        found, by_ticket = later()
        assert by_ticket and _same(found, _alone(stack[1], objects, counts))
        assert m._costs == 1
        assert served(views[1]) is None  # each layer once
        assert _same(served(views[0]), _alone(stack[0], objects, counts))
        assert m._costs == 1
        found, by_ticket = later(view=stack[1])  # another view of the same layer: the same call, by its stack
        assert not by_ticket and _same(found, _alone(stack[1], objects, counts))
        assert later(change=lambda: stack[1].mul_(0.5))[0] is None  # in place: the version moves on
        assert later(change=lambda: objects.add_(0.0))[0] is None  # the objects in place
        assert later(objects_=objects.clone())[0] is None  # other objects
        assert later(counts_=[3, 2])[0] is None  # another layout
        assert later(change=lambda: setattr(m, "gain", 3.0))[0] is None  # another setting
        m.gain = 2.0
        assert later(region=True)[0] is None  # another autocast region
        # the same tensor made a view of layer 0 (no version moves on): served as layer 0's call, by its stack
        found, by_ticket = later(change=lambda: setattr(views[1], "data", stack[0]))
        assert not by_ticket and _same(found, _alone(stack[0], objects, counts))


def test_a_named_call_is_served_again_without_its_layout_by_the_same_rule():
    """served_again: a later call the loss named, served by its ticket where the solve holds its objects unchanged and
    of the same shapes (which give its layout), with the same tag, groups, backend, settings and autocast region;
    after any change that rule sees, None (its caller then goes the way of served())."""
    g = torch.Generator().manual_seed(8)
    stack, objects, counts = torch.rand(3, 2, 6, 4, generator=g), torch.rand(5, 4, generator=g), [2, 3]
    views = [stack[k] for k in range(3)]
    m = Matcher()

    def later(change=lambda: None, objects_=None, tag="keys", groups=1, backend="reference", region=False):
        """A new first call (on layer 2, tagged "keys"), ``change()``, then the call on layer 1."""
        core._MEMOS.pop(m, None)
        where = core.layout(counts, 6, 1, "cpu")
        core.layered(m, (views[2],), (objects,), where, m.costs(where, objects), "reference", True, tag="keys")
        change()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=region):
            return core.served_again(m, (views[1],), (objects if objects_ is None else objects_,), tag, groups,
                                     backend, True)

    with core.loss_call(m, [(v,) for v in views]):
        assert _same(later(), _alone(stack[1], objects, counts))
        assert core.served_again(m, (views[1],), (objects,), "keys", 1, "reference", True) is None  # once
        assert _same(core.served_again(m, (views[0],), (objects,), "keys", 1, "reference", True),
                     _alone(stack[0], objects, counts))
        assert m._costs == 1
        assert later(change=lambda: stack[1].mul_(0.5)) is None  # in place: the version moves on
        assert later(change=lambda: objects.add_(0.0)) is None  # the objects in place
        assert later(objects_=objects.clone()) is None  # other objects
        assert later(tag="other keys") is None
        assert later(groups=2) is None
        assert later(backend="kernel") is None
        assert later(change=lambda: setattr(m, "gain", 3.0)) is None  # another setting
        m.gain = 2.0
        assert later(region=True) is None  # another autocast region
        assert _same(later(), _alone(stack[1], objects, counts))
        # the same tensor given another shape (its version does not move on): not served
        assert later(change=lambda: setattr(objects, "data", torch.rand(6, 4, generator=g))) is None


@pytest.mark.parametrize("form", ["stack[l]", "stack[:, l]", "stack[:, l, 1:]", "block l of a flat stack"])
def test_tickets_serve_each_form_of_stack_its_own_layer(form, monkeypatch):
    """The layers a loss call names of each form of stack that layer_of knows (an (L, B, Q, .) stack's select, a
    (B, L, Q, .) stack's, a contiguous block of a flat one): the first call leaves each a ticket (the others' layers
    told without layer_of), and each later call is served its own layer's matches, those of a call of its own. A
    view may start past its layer's first element (a slice of the queries)."""
    g = torch.Generator().manual_seed(6)
    layers, objects, counts = 3, torch.rand(5, 4, generator=g), [2, 3]
    if form == "stack[l]":
        stack = torch.rand(layers, 2, 6, 4, generator=g)
        views = [stack[k] for k in range(layers)]
    elif form == "stack[:, l]":
        stack = torch.rand(2, layers, 6, 4, generator=g)
        views = [stack[:, k] for k in range(layers)]
    elif form == "stack[:, l, 1:]":  # each view starts past its layer's first element
        stack = torch.rand(2, layers, 7, 4, generator=g)
        views = [stack[:, k, 1:] for k in range(layers)]
    else:
        stack = torch.rand(layers * 2 * 6, 4, generator=g)
        views = [stack[k * 12:(k + 1) * 12].view(2, 6, 4) for k in range(layers)]
    m = Matcher()
    keyed, plain_keyed = [], core._keyed
    monkeypatch.setattr(core, "_keyed", lambda *a, **k: keyed.append(1) or plain_keyed(*a, **k))
    where = core.layout(counts, 6, 1, "cpu")
    with core.loss_call(m, [(v,) for v in views]):
        assert _same(_call(m, views[1], objects, counts), _alone(views[1], objects, counts))
        assert len(keyed) == 1  # the first call's own: the other layers told without it
        for k in (2, 0):
            found = core.served(m, (views[k],), (objects,), where, "reference", True)
            assert _same(found, _alone(views[k], objects, counts))
    assert m._costs == 1 and len(keyed) == 1


def test_a_loss_call_costs_only_the_layers_its_calls_name(monkeypatch):
    """A decoder's stack may hold a layer that no call of the loss matches (DETR's auxiliary outputs stop before its
    last layer): inside a loss call, the first call costs and solves the layers from the first to the last that the
    calls name, each call is served its own layer, and a call on a layer not named is matched afresh (a new solve, with
    the named layers), its matches those of a call of its own."""
    g = torch.Generator().manual_seed(7)
    stack, objects, counts = torch.rand(5, 2, 6, 4, generator=g), torch.rand(5, 4, generator=g), [2, 3]
    views = [stack[k] for k in range(5)]
    alone = [_alone(v, objects, counts) for v in views]
    m = Matcher()
    seen, solved = [], core.solve
    costs = m.costs

    def counted(where, objects_):
        inner = costs(where, objects_)
        return lambda stacks: seen.append(stacks[0].shape[0]) or inner(stacks)

    monkeypatch.setattr(m, "costs", counted)
    monkeypatch.setattr(core, "solve", lambda problems, where, backend, layers=1: seen.append(("solve", layers)) or
                        solved(problems, where, backend, layers))
    where = core.layout(counts, 6, 1, "cpu")
    with core.loss_call(m, [(views[k],) for k in (3, 1, 2)]):
        assert _same(_call(m, views[3], objects, counts), alone[3])
        assert seen == [3, ("solve", 3)]  # layers 1 to 3 of 5
        for k in (1, 2):
            assert _same(core.served(m, (views[k],), (objects,), where, "reference", True), alone[k])
        assert core.served(m, (views[4],), (objects,), where, "reference", True) is None  # not named
        assert _same(_call(m, views[4], objects, counts), alone[4])
    assert seen == [3, ("solve", 3), 4, ("solve", 4)]  # its own layer and those named: 1 to 4
    seen.clear()  # outside a loss call, the first call costs every layer for the calls to come
    core._MEMOS.pop(m, None)
    assert _same(_call(m, views[0], objects, counts), alone[0])
    assert seen == [5, ("solve", 5)]


@pytest.mark.parametrize("unstacked", [False, True])
def test_a_part_of_one_layer_is_handed_on_as_its_calls_inputs_where_asked(unstacked):
    """layered(unstacked=True): inside a loss call, a part of one layer (an output of its own, or the one layer a loss
    names of another stack) reaches ``joined`` as its call's inputs themselves, not as a (1, ...) view; a part of more
    layers as their stacked views. Either way each call is served its own matches, those of a call of its own."""
    g = torch.Generator().manual_seed(9)
    stack, other, objects, counts = (torch.rand(3, 2, 6, 4, generator=g), torch.rand(4, 2, 6, 4, generator=g),
                                     torch.rand(5, 4, generator=g), [2, 3])
    own = torch.rand(2, 6, 4, generator=g)  # an output of its own (no stack)
    calls = [stack[2], stack[0], own, other[1], stack[1]]
    m = Matcher()
    where = core.layout(counts, 6, 1, "cpu")
    seen = []

    def joined(views):
        seen.append([part[0] for part in views])
        return core.by_dtypes([[v if v.dim() == 4 else v[None] for v in part] for part in views],
                              m.costs(where, objects))

    with core.loss_call(m, [(t,) for t in calls]):
        first = core.layered(m, (calls[0],), (objects,), where, m.costs(where, objects), "reference", True,
                             joined=joined, unstacked=unstacked)
        assert _same(first, _alone(calls[0], objects, counts))
        for t in calls[1:]:
            assert _same(core.served(m, (t,), (objects,), where, "reference", True), _alone(t, objects, counts))
    (views,) = seen
    assert [tuple(v.shape) for v in views] == [(3, 2, 6, 4)] + [(2, 6, 4) if unstacked else (1, 2, 6, 4)] * 2
    if unstacked:
        assert views[1] is own and views[2] is calls[3]
    else:
        assert views[1]._base is own and views[2]._base is other and torch.equal(views[2][0], other[1])
    assert m._costs == 1


def test_a_stacks_refusals_are_read_once_and_raised_at_their_layers_call(library, monkeypatch):
    """With the check on, the first call on a stack reads the status of every layer in one read (settle); a layer
    whose problem SciPy refuses raises SciPy's error at its own call, the others are served from what was read."""
    g = torch.Generator().manual_seed(2)
    stack, objects, counts = torch.rand(3, 2, 6, 4, generator=g), torch.rand(5, 4, generator=g), [2, 3]
    stack[1, 1, 4, 0] = float("nan")  # layer 1, image 1: a NaN cost
    reads, taken = [], []
    settle, raise_unsolved = core.settle, core.matching.raise_unsolved
    monkeypatch.setattr(core, "settle", lambda *a: reads.append(1) or settle(*a))
    monkeypatch.setattr(core.matching, "raise_unsolved", lambda info, *a: taken.append(type(info)) or
                        raise_unsolved(info, *a))
    alone = [_alone(stack[k], objects, counts) for k in (0, 2)]
    reads.clear()
    m = Matcher()
    assert _same(_call(m, stack[2], objects, counts), alone[1])
    assert _same(_call(m, stack[0], objects, counts), alone[0])
    with pytest.raises(ValueError, match=r"^image 1: matrix contains invalid numeric entries$"):
        _call(m, stack[1], objects, counts)
    assert m._costs == 1 and len(reads) == 1 and set(taken) == {list}


def test_guarded_problems_declined_go_back_to_the_trainer(library):
    """Problems Guarded by a flag that is set give no matches (None: the trainer's own code runs), read after the
    solve; a flag that is clear gives the matches of the problems alone."""
    g = torch.Generator().manual_seed(3)
    stack, objects, counts = torch.rand(2, 2, 6, 4, generator=g), torch.rand(5, 4, generator=g), [2, 3]
    where = core.layout(counts, 6, 1, "cpu")
    plain = Matcher().costs(where, objects)

    def guarded(flag):
        return lambda stacks: core.Guarded(plain(stacks), torch.tensor(flag))

    for check in (False, True):
        assert core.solve_call(guarded(True)([stack[0][None]]), where, "kernel", check) is None
        assert _same(core.solve_call(guarded(False)([stack[0][None]]), where, "kernel", check),
                     _alone(stack[0], objects, counts))
        core._MEMOS.clear()
        assert core.layered(Matcher(), (stack[0],), (objects,), where, guarded(True), "kernel", check) is None
        assert _same(core.layered(Matcher(), (stack[1],), (objects,), where, guarded(False), "kernel", check),
                     _alone(stack[1], objects, counts))


def test_the_memo_serves_only_the_same_autocast_region():
    """A later layer's call under another autocast region (where a cost may round otherwise) is matched afresh."""
    g = torch.Generator().manual_seed(4)
    stack, objects, counts = torch.rand(3, 2, 6, 4, generator=g), torch.rand(5, 4, generator=g), [2, 3]
    m = Matcher()
    _call(m, stack[0], objects, counts)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _same(_call(m, stack[1], objects, counts), _alone(stack[1], objects, counts))
    assert m._costs == 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _call(m, stack[2], objects, counts)  # the region of the memo's call: served
    assert m._costs == 2


def test_inference_tensors_are_matched_alone():
    """Tensors made under torch.inference_mode track no version, so a call on them cannot be keyed: it is a call of
    its own (None), never an error."""
    with torch.inference_mode():
        stack, objects = torch.rand(3, 2, 6, 4), torch.rand(5, 4)
    m = Matcher()
    assert _call(m, stack[1], objects, [2, 3]) is None and m._costs == 0
    plain = torch.rand(3, 2, 6, 4)
    assert _call(m, plain[1], objects, [2, 3]) is None and m._costs == 0


def test_settings_of_a_matcher():
    m = Matcher()
    m.cost_gain = {"class": 2, "bbox": 5}
    m.variant = ("padded", True)
    m._private, m.module = 7, torch.nn.Linear(1, 1)
    assert core.settings_of(m) == (("gain", 2.0), ("cost_gain", (("class", 2), ("bbox", 5))),
                                   ("variant", ("padded", True)))


def test_the_cost_is_taken_only_in_its_own_thread():
    """Tensor.cpu is hooked only while a cost_at_cpu block runs, and there only for that block's thread: another
    thread's copies to the host are torch's own, and the hook is gone afterwards. Capturing copies and goes on."""
    cost = torch.rand(2, 3, 4)
    seen = {}

    def other_thread():
        seen["other"] = cost.cpu()  # 3-D, in another thread, while the hook is installed

    with pytest.raises(core.CostTaken) as taken:
        with core.cost_at_cpu():
            assert "cpu" in vars(torch.Tensor)
            worker = threading.Thread(target=other_thread)
            worker.start()
            worker.join()
            cost.cpu()
    assert taken.value.cost is cost and torch.equal(seen["other"], cost)
    assert "cpu" not in vars(torch.Tensor) and torch.Tensor.cpu is torch._C.TensorBase.cpu
    with core.cost_at_cpu(stop=False) as captured:
        out = cost.cpu()
        torch.rand(3).cpu()  # not 3-D: not a cost
    assert torch.equal(out, cost) and len(captured) == 1 and torch.equal(captured[0], cost)
