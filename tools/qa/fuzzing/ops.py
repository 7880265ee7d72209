"""The ops a random model is drawn from. Each takes the model, adds lines and values, and
returns False when no live value fits."""

from __future__ import annotations

from collections.abc import Callable

from fuzzing.model import SIZES, Model, Value, is_float, is_float_rank


def op_linear(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    n_in, n_out = x.shape[-1], m.rng.choice(SIZES)
    bias = m.rng.random() < 0.8
    lin = m.module("lin", f"nn.Linear({n_in}, {n_out}, bias={bias})", reuse=0.4)
    frozen = f"{lin}.weight.requires_grad_(False)"
    if bias and m.rng.random() < 0.08 and frozen not in m.init:  # the bias still trains
        m.init.append(frozen)
        m.features["frozen parameter"] += 1
    m.read(x, saved=True)
    y = m.new("f", (*x.shape[:-1], n_out), grad=True, writable=True)
    m.line(f"{y.name} = {lin}({x.name})")
    m.features["Linear"] += 1
    return True


ACTIVATIONS = {  # source template, whether the backward keeps the output (not the input)
    "relu": ("torch.relu({x})", True),
    "gelu": ("F.gelu({x})", False),
    "tanh": ("{x}.tanh()", True),
    "sigmoid": ("torch.sigmoid({x})", True),
    "silu": ("F.silu({x})", False),
    "leaky_relu": ("F.leaky_relu({x}, 0.1)", False),
}
ACTIVATION_MODULES = {"relu": "nn.ReLU()", "gelu": "nn.GELU()", "tanh": "nn.Tanh()"}


def op_activation(m: Model) -> bool:
    x = m.pick(is_float)
    if x is None:
        return False
    name = m.rng.choice(sorted(ACTIVATIONS))
    template, keeps_output = ACTIVATIONS[name]
    if name in ACTIVATION_MODULES and m.rng.random() < 0.4:
        call = f"{m.module('act', ACTIVATION_MODULES[name], reuse=0.5)}({x.name})"
    else:
        call = template.format(x=x.name)
    m.read(x, saved=not keeps_output)
    y = m.new("f", x.shape, grad=x.grad, writable=not keeps_output)
    m.line(f"{y.name} = {call}")
    m.features[f"activation {name}"] += 1
    return True


def op_inplace(m: Model) -> bool:
    """An in-place write: relu_, ReLU(inplace=True), add_, +=, mul_, masked_fill_, x[m] = 0."""
    if not m.inplace:
        return False
    x = m.pick(lambda v: is_float(v) and v.writable)
    if x is None:
        return False
    choice = m.rng.choice(["relu_", "module", "functional", "add_", "iadd", "mul_", "mask"])
    if choice in ("relu_", "module", "functional"):
        if choice == "relu_":
            m.line(f"{x.name}.relu_()")
        elif choice == "module":
            relu = m.module("relu", "nn.ReLU(inplace=True)", reuse=0.5)
            m.line(f"{x.name} = {relu}({x.name})")
        else:
            m.line(f"{x.name} = F.relu({x.name}, inplace=True)")
        x.writable = False  # relu keeps its output for backward
        m.features[f"in-place {'nn.ReLU(inplace=True)' if choice == 'module' else choice}"] += 1
    elif choice in ("add_", "iadd"):
        y = m.pick(
            lambda v: v.kind == "f" and _broadcasts(v, x) and _root(v) is not _root(x), avoid=[x]
        )
        if y is None:
            return False
        m.read(y)
        m.line(f"{x.name}.add_({y.name})" if choice == "add_" else f"{x.name} += {y.name}")
        x.grad = x.grad or y.grad
        m.features[f"in-place {choice}"] += 1
    elif choice == "mul_":
        m.line(f"{x.name}.mul_(0.5)")
        m.features["in-place mul_"] += 1
    else:
        mask = m.pick(lambda v: v.kind == "b" and v.batch and v.shape in (x.shape, x.shape[:-1]))
        if mask is None:  # a mask made from the value itself, before the write
            mask = m.new("b", x.shape)
            m.line(f"{mask.name} = {x.name} > 0.5")
        m.read(mask)
        index = mask.name if mask.shape == x.shape else f"{mask.name}.unsqueeze(-1)"
        if m.rng.random() < 0.5:
            m.line(f"{x.name}.masked_fill_({index}, 0.0)")
            m.features["in-place masked_fill_"] += 1
        elif mask.shape == x.shape:
            m.line(f"{x.name}[{mask.name}] = 0.0")
            m.features["in-place x[mask] = 0"] += 1
        else:
            return False
    x.uses += 1
    return True


def _root(v: Value) -> Value:
    while v.base is not None:
        v = v.base
    return v


def _broadcasts(small: Value, big: Value) -> bool:
    """Whether ``small`` broadcasts onto the batch value ``big`` without changing its shape."""
    if small.batch:
        return small.shape == big.shape
    return len(small.shape) <= len(big.shape) and big.shape[
        len(big.shape) - len(small.shape) :
    ] == (small.shape)


def op_residual(m: Model) -> bool:
    x = m.pick(is_float)
    if x is None:
        return False
    y = m.pick(lambda v: is_float(v) and v.shape == x.shape, avoid=[x])
    if y is None:
        return False
    m.read(x, y)
    z = m.new("f", x.shape, grad=x.grad or y.grad, writable=True)
    form = m.rng.choice(["{x} + {y}", "{x} - {y}", "torch.add({x}, {y}, alpha=0.5)"])
    m.line(f"{z.name} = {form.format(x=x.name, y=y.name)}")
    m.features["residual add"] += 1
    return True


def op_gate(m: Model) -> bool:
    x = m.pick(is_float)
    if x is None:
        return False
    g = m.pick(lambda v: is_float(v) and v.shape == x.shape) or x
    m.read(x, g, saved=True)
    z = m.new("f", x.shape, grad=x.grad or g.grad)
    m.line(f"{z.name} = torch.sigmoid({g.name}) * {x.name}")
    m.features["gate sigmoid(g) * x"] += 1
    return True


def op_cat(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    dim = m.rng.choice([-1, 1]) if len(x.shape) >= 2 else -1
    axis = len(x.shape) - 1 if dim == -1 else 0

    def fits(v: Value) -> bool:
        same = [d for k, d in enumerate(v.shape) if k != axis] == [
            d for k, d in enumerate(x.shape) if k != axis
        ]
        return is_float(v) and len(v.shape) == len(x.shape) and same

    y = m.pick(fits) or x
    m.read(x, y)
    shape = list(x.shape)
    shape[axis] += y.shape[axis]
    z = m.new("f", shape, grad=x.grad or y.grad, writable=True)
    m.line(f"{z.name} = torch.cat([{x.name}, {y.name}], dim={dim})")
    m.features["cat"] += 1
    return True


def op_chunk(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1 and v.shape[-1] >= 4)
    if x is None:
        return False
    n = x.shape[-1]
    if n % 2 == 0 and m.rng.random() < 0.5:
        sizes, call = [n // 2, n // 2], f"{x.name}.chunk(2, dim=-1)"
        m.features["chunk"] += 1
    else:
        k = m.rng.randint(1, n - 1)
        sizes, call = [k, n - k], f"torch.split({x.name}, [{k}, {n - k}], dim=-1)"
        m.features["split"] += 1
    parts = [m.view_of(x, (*x.shape[:-1], s), contiguous=False) for s in sizes]
    x.uses -= 1
    m.line(f"{', '.join(p.name for p in parts)} = {call}")
    return True


def op_layernorm(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    norm = m.module("norm", f"nn.LayerNorm({x.shape[-1]})", reuse=0.4)
    m.read(x, saved=True)
    y = m.new("f", x.shape, grad=True)
    m.line(f"{y.name} = {norm}({x.name})")
    m.features["LayerNorm"] += 1
    return True


def op_batchnorm(m: Model) -> bool:
    x = m.pick(is_float_rank(1, 2, 3))
    if x is None:
        return False
    kind = "BatchNorm2d" if len(x.shape) == 3 else "BatchNorm1d"
    norm = m.module("bn", f"nn.{kind}({x.shape[0]})")
    m.read(x, saved=True)
    y = m.new("f", x.shape, grad=True)
    m.line(f"{y.name} = {norm}({x.name})")
    m.features[f"{kind} (training)"] += 1
    return True


def op_conv(m: Model) -> bool:
    x = m.pick(is_float_rank(2, 3))
    if x is None:
        return False
    channels, kernel = m.rng.choice(SIZES), m.rng.choice([1, 3])
    kind = "Conv1d" if len(x.shape) == 2 else "Conv2d"
    conv = m.module("conv", f"nn.{kind}({x.shape[0]}, {channels}, {kernel}, padding={kernel // 2})")
    m.read(x, saved=True)
    y = m.new("f", (channels, *x.shape[1:]), grad=True, writable=True)
    m.line(f"{y.name} = {conv}({x.name})")
    m.features[kind] += 1
    return True


def op_pool(m: Model) -> bool:
    x = m.pick(lambda v: is_float_rank(2, 3)(v) and all(d % 2 == 0 for d in v.shape[1:]))
    if x is None:
        return False
    dims = "1d" if len(x.shape) == 2 else "2d"
    kind = m.rng.choice(["max", "avg"])
    if m.rng.random() < 0.5:
        call = f"F.{kind}_pool{dims}({x.name}, 2)"
    else:
        pool = m.module("pool", f"nn.{kind.capitalize()}Pool{dims}(2)", reuse=0.5)
        call = f"{pool}({x.name})"
    m.read(x, saved=True)  # max keeps its input; avg pool 1d is avg pool 2d of a view
    shape = (x.shape[0], *(d // 2 for d in x.shape[1:]))
    y = m.new("f", shape, grad=x.grad, writable=kind == "avg")
    m.line(f"{y.name} = {call}")
    m.features[f"{kind} pool {dims}"] += 1
    return True


def op_flatten(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 2)
    if x is None:
        return False
    forms = ["{x}.reshape({x}.size(0), -1)", "{x}.flatten(1)", "torch.flatten({x}, 1)"]
    if x.contiguous:
        forms += ["{x}.view({x}.shape[0], -1)"]
        if len(x.shape) == 2:
            forms += ["{x}.view({x}.size(0), {x}.size(1) * {x}.size(2))"]
    total = 1
    for d in x.shape:
        total *= d
    y = m.view_of(x, (total,))
    m.line(f"{y.name} = {m.rng.choice(forms).format(x=x.name)}")
    m.features["flatten / view (shape arithmetic)"] += 1
    return True


def op_unflatten(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) == 1 and v.contiguous and v.shape[0] >= 8)
    if x is None:
        return False
    n = x.shape[0]
    splits = [d for d in (2, 3, 4) if n % d == 0 and n // d >= 2]
    if not splits:  # a prime size (a vocabulary of 17)
        return False
    a = m.rng.choice(splits)
    b = n // a
    forms = [
        f"{{x}}.view({{x}}.size(0), {a}, -1)",
        f"{{x}}.view({{x}}.size(0), {{x}}.size(1) // {b}, {b})",
        f"{{x}}.unflatten(1, ({a}, {b}))",
    ]
    y = m.view_of(x, (a, b))
    m.line(f"{y.name} = {m.rng.choice(forms).format(x=x.name)}")
    m.features["unflatten / view (shape arithmetic)"] += 1
    return True


def op_transpose(m: Model) -> bool:
    x = m.pick(is_float_rank(2))
    if x is None:
        return False
    y = m.view_of(x, (x.shape[1], x.shape[0]), contiguous=False)
    m.line(f"{y.name} = {x.name}.transpose(1, 2)")
    m.features["transpose"] += 1
    return True


def op_embedding(m: Model) -> bool:
    ids = m.pick(lambda v: v.kind == "i" and v.vocab > 0)
    if ids is None:
        return False
    dim = m.rng.choice(SIZES)
    emb = m.module("emb", f"nn.Embedding({ids.vocab}, {dim})", reuse=0.3)
    m.embeddings.append((emb, ids.vocab, dim))
    m.read(ids)
    y = m.new("f", (*ids.shape, dim), grad=True, batch=ids.batch, writable=True)
    m.line(f"{y.name} = {emb}({ids.name})")
    m.features["Embedding" if ids.batch else "Embedding of positions (no batch)"] += 1
    return True


def op_tied_head(m: Model) -> bool:
    """An output head sharing an embedding's weight (a tied parameter)."""
    if not m.embeddings:
        return False
    emb, vocab, dim = m.rng.choice(m.embeddings)
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1 and v.shape[-1] == dim)
    if x is None:
        return False
    m.read(x, saved=True)
    y = m.new("f", (*x.shape[:-1], vocab), grad=True, writable=True)
    if m.rng.random() < 0.5:
        m.line(f"{y.name} = F.linear({x.name}, {emb}.weight)")
    else:
        head = m.fresh("head")
        m.init.append(f"self.{head} = nn.Linear({dim}, {vocab}, bias=False)")
        m.init.append(f"self.{head}.weight = {emb}.weight")
        m.line(f"{y.name} = self.{head}({x.name})")
    m.features["tied weights (embedding and head)"] += 1
    return True


def op_attention(m: Model) -> bool:
    x = m.pick(is_float_rank(2))
    if x is None:
        return False
    t, d = x.shape
    heads = m.rng.choice([h for h in (1, 2) if d % h == 0])
    m.read(x, saved=True)
    q, k, v = (m.fresh(p) for p in ("q", "k", "val"))
    if m.rng.random() < 0.5:
        qkv = m.module("qkv", f"nn.Linear({d}, {3 * d})")
        m.line(f"{q}, {k}, {v} = {qkv}({x.name}).chunk(3, dim=-1)")
    else:
        for name in (q, k, v):
            m.line(f"{name} = {m.module('proj', f'nn.Linear({d}, {d})')}({x.name})")
    if heads > 1:  # (B, T, D) -> (B, H, T, D/H) by shape arithmetic
        for name in (q, k, v):
            m.line(
                f"{name} = {name}.view({name}.size(0), {name}.size(1), {heads}, -1).transpose(1, 2)"
            )
    s = m.fresh("scores")
    m.line(f"{s} = {q} @ {k}.transpose(-2, -1) * ({k}.size(-1) ** -0.5)")
    mask = m.pick(lambda v: v.kind == "b" and v.batch and v.shape == (t,))
    ids = m.pick(lambda v: v.kind == "i" and v.batch and v.shape == (t,))
    masking = m.rng.choice(["none", "causal", "padding"])
    if masking == "padding" and mask is None and ids is not None:
        m.read(ids)
        mask = m.new("b", (t,))
        m.line(f"{mask.name} = {ids.name} == 0")
    if masking == "causal":
        m.line(f"causal = torch.triu(torch.ones({t}, {t}, dtype=torch.bool), diagonal=1)")
        m.line(f'{s} = {s}.masked_fill(causal, float("-inf"))')
        m.features["causal mask (constant, -inf)"] += 1
    elif masking == "padding" and mask is not None:
        m.read(mask)
        expand = ".unsqueeze(1)" if heads == 1 else "[:, None, None, :]"
        m.line(f"{s} = {s}.masked_fill({mask.name}{expand}, -1e9)")
        m.features["padding mask (bool value)"] += 1
    weights = "F.softmax({s}, dim=-1)" if m.rng.random() < 0.5 else "{s}.softmax(-1)"
    y = m.new("f", (t, d), grad=True, writable=True, contiguous=heads == 1)  # reshape: maybe a view
    m.line(f"{y.name} = {weights.format(s=s)} @ {v}")
    if heads > 1:
        m.line(f"{y.name} = {y.name}.transpose(1, 2).reshape({y.name}.size(0), {t}, {d})")
    m.features[f"attention ({heads} head{'s' if heads > 1 else ''})"] += 1
    return True


def op_mask(m: Model) -> bool:
    """A boolean value: from integer ids (padding) or from a comparison of floats."""
    ids = m.pick(lambda v: v.kind == "i" and v.batch)
    if ids is not None and m.rng.random() < 0.6:
        form = m.rng.choice(["{x} == 0", "{x}.eq(0)", "{x} != 0"])
        m.read(ids)
        y = m.new("b", ids.shape)
        m.line(f"{y.name} = {form.format(x=ids.name)}")
        m.features["bool mask from ids"] += 1
        return True
    x = m.pick(is_float)
    if x is None:
        return False
    m.read(x)
    y = m.new("b", x.shape)
    m.line(f"{y.name} = {m.rng.choice(['{x} > 0', '{x}.abs() < 0.5']).format(x=x.name)}")
    m.features["bool mask from floats"] += 1
    return True


def op_apply_mask(m: Model) -> bool:
    mask = m.pick(lambda v: v.kind == "b" and v.batch)
    if mask is None:
        return False
    x = m.pick(lambda v: is_float(v) and v.shape in (mask.shape, (*mask.shape, *v.shape[-1:])))
    if x is None:
        return False
    index = mask.name if x.shape == mask.shape else f"{mask.name}.unsqueeze(-1)"
    form = m.rng.choice(
        [
            "{x}.masked_fill({m}, 0.0)",
            "torch.where({m}, {x}, torch.zeros_like({x}))",
            "{x} * {m}.float()",
            "{x} * {m}.to({x}.dtype)",
        ]
    )
    m.read(x, saved="*" in form)
    m.read(mask)
    y = m.new("f", x.shape, grad=x.grad, writable=True)
    m.line(f"{y.name} = {form.format(x=x.name, m=index)}")
    m.features["masked_fill / where / mask as float"] += 1
    return True


def op_integer(m: Model) -> bool:
    """An integer value computed in forward: positions, remainders, an argmax."""
    ids = m.pick(lambda v: v.kind == "i" and v.batch and len(v.shape) == 1)
    choice = m.rng.choice(["cumsum", "mod", "argmax", "arange"])
    if choice in ("cumsum", "mod") and ids is not None:
        m.read(ids)
        t = ids.shape[0]
        if choice == "cumsum":
            y = m.new("i", ids.shape, vocab=t + 1)
            m.line(f"{y.name} = ({ids.name} != 0).long().cumsum(-1)")
        else:
            y = m.new("i", ids.shape, vocab=3)
            m.line(f"{y.name} = {ids.name} % 3")
        m.features[f"integer value ({choice})"] += 1
        return True
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    m.read(x)
    if choice == "arange" and len(x.shape) == 2:
        y = m.new("i", (x.shape[0],), batch=False, vocab=x.shape[0])
        m.line(f"{y.name} = torch.arange({x.name}.size(1))")
        m.features["integer value (arange of a size, no batch)"] += 1
        return True
    y = m.new("i", x.shape[:-1], vocab=x.shape[-1])
    m.line(f"{y.name} = {x.name}.argmax(-1)")
    m.features["integer value (argmax)"] += 1
    return True


def op_count(m: Model) -> bool:
    """Divide by a count of non-padding ids: an integer made float, without gradient."""
    ids = m.pick(lambda v: v.kind == "i" and v.batch and len(v.shape) == 1)
    x = m.pick(lambda v: is_float(v) and len(v.shape) == 1)
    if ids is None or x is None:
        return False
    m.read(ids)
    m.read(x, saved=True)
    y = m.new("f", x.shape, grad=x.grad)
    m.line(f"{y.name} = {x.name} / ({ids.name}.ne(0).sum(-1, keepdim=True).float() + 1)")
    m.features["count of ids as float"] += 1
    return True


def op_parameter(m: Model) -> bool:
    """A bare nn.Parameter: scaling or shifting a value, or a value of its own (no batch)."""
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    n = x.shape[-1]
    p = m.fresh("p")
    if m.rng.random() < 0.5:
        m.init.append(f"self.{p} = nn.Parameter(torch.ones({n}))")
        form = "{x} * self.{p}"
    else:
        m.init.append(f"self.{p} = nn.Parameter(0.1 * torch.randn({n}))")
        form = "{x} + self.{p}"
    if m.rng.random() < 0.3:  # the parameter's own value, computed once per forward
        w = m.new("f", (n,), batch=False, grad=True)
        m.line(f"{w.name} = self.{p}.tanh()")
        m.features["value from a parameter (no batch)"] += 1
        return True
    m.read(x, saved="*" in form)
    y = m.new("f", x.shape, grad=True, writable=True)
    m.line(f"{y.name} = {form.format(x=x.name, p=p)}")
    m.features["bare nn.Parameter"] += 1
    return True


def op_positions(m: Model) -> bool:
    """Learned positions: ``arange`` of a size (no batch), embedded, added to a (T, D) value."""
    x = m.pick(is_float_rank(2))
    if x is None:
        return False
    t, d = x.shape
    m.read(x)
    pos = m.new("i", (t,), batch=False, vocab=t)
    table = m.module("pos", f"nn.Embedding({t}, {d})", reuse=0.5)
    m.line(f"{pos.name} = torch.arange({x.name}.size(1))")
    if m.rng.random() < 0.5:  # the position embedding is its own value (it may cross stages)
        w = m.new("f", (t, d), batch=False, grad=True)
        m.line(f"{w.name} = {table}({pos.name})")
        m.features["Embedding of positions (no batch)"] += 1
        return True
    y = m.new("f", x.shape, grad=True, writable=True, contiguous=x.contiguous)
    m.line(f"{y.name} = {x.name} + {table}({pos.name})")
    m.features["Embedding of positions (no batch)"] += 1
    return True


def op_broadcast(m: Model) -> bool:
    """A value without the batch dimension (parameter-made, positions) applied to a batch one."""
    w = m.pick(lambda v: v.kind == "f" and not v.batch)
    if w is None:
        return False
    x = m.pick(lambda v: is_float(v) and _broadcasts(w, v))
    if x is None:
        return False
    op = m.rng.choice(["+", "*"])
    m.read(x, w, saved=op == "*")
    y = m.new("f", x.shape, grad=x.grad or w.grad, writable=True)
    m.line(f"{y.name} = {x.name} {op} {w.name}")
    m.features["no-batch value broadcast"] += 1
    return True


def op_buffer(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    n = x.shape[-1]
    buf = m.fresh("buf")
    persistent = m.rng.random() < 0.7
    m.init.append(
        f'self.register_buffer("{buf}", torch.linspace(-1, 1, {n}), persistent={persistent})'
    )
    m.read(x)
    y = m.new("f", x.shape, grad=x.grad, writable=True)
    m.line(f"{y.name} = {x.name} + self.{buf}")
    m.features["buffer" if persistent else "buffer (not persistent)"] += 1
    return True


def op_buffer_update(m: Model) -> bool:
    """A buffer mutated in forward (a call counter, a running mean under no_grad), never read
    by the outputs, whose values would otherwise depend on the micro-batching."""
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    name = m.fresh("stat")
    if m.rng.random() < 0.5:
        m.init.append(f'self.register_buffer("{name}", torch.zeros((), dtype=torch.long))')
        m.line(f"self.{name}.add_(1)")
        m.features["buffer mutated (counter)"] += 1
        return True
    n = x.shape[-1]
    m.init.append(f'self.register_buffer("{name}", torch.zeros({n}))')
    m.read(x)
    m.line("with torch.no_grad():")
    m.line(f"    self.{name}.mul_(0.9).add_(0.1 * {x.name}.detach().reshape(-1, {n}).mean(0))")
    m.features["buffer mutated (running mean, no_grad)"] += 1
    return True


def op_constant(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    n = x.shape[-1]
    numbers = ", ".join(f"{m.rng.uniform(-1, 1):.2f}" for _ in range(n))
    form = m.rng.choice(
        [
            "{x} * 0.5 + 1.0",
            "{x} * ({x}.size(-1) ** -0.5)",
            "{x} - {x}.mean(-1, keepdim=True)",
            f"{{x}} + torch.tensor([{numbers}])",
            f"{{x}} * torch.linspace(0.5, 1.5, {n})",
        ]
    )
    m.read(x, saved="{x} *" in form and "0.5 + 1.0" not in form and "size" not in form)
    y = m.new("f", x.shape, grad=x.grad, writable=True)
    m.line(f"{y.name} = {form.format(x=x.name)}")
    m.features["constants"] += 1
    return True


def op_reduce(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 2)
    if x is None:
        return False
    form = m.rng.choice(["{x}.mean(1)", "{x}.sum(dim=1)", "{x}.amax(1)", "torch.mean({x}, dim=1)"])
    m.read(x, saved="amax" in form)
    y = m.new("f", x.shape[1:], grad=x.grad, writable="amax" not in form)  # amax keeps both
    m.line(f"{y.name} = {form.format(x=x.name)}")
    m.features["reduction"] += 1
    return True


def op_softmax(m: Model) -> bool:
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    m.read(x)
    y = m.new("f", x.shape, grad=x.grad)
    m.line(f"{y.name} = {x.name}.softmax(dim=-1)")
    m.features["softmax"] += 1
    return True


def op_dropout(m: Model) -> bool:
    x = m.pick(is_float)
    if x is None:
        return False
    if m.rng.random() < 0.5:
        call = f"{m.module('drop', 'nn.Dropout(0.0)', reuse=0.5)}({x.name})"
    else:
        call = f"F.dropout({x.name}, p=0.0, training=self.training)"
    y = m.view_of(x, x.shape)  # with p=0 the result may be the input itself
    m.line(f"{y.name} = {call}")
    m.features["dropout p=0"] += 1
    return True


def op_shape_branch(m: Model) -> bool:
    """Python control flow on a size: torch.fx cannot trace it, so torch.export is used."""
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    m.read(x)
    y = m.new("f", x.shape, grad=x.grad, writable=True)
    m.line(f"if {x.name}.shape[-1] % 2 == 0:")
    m.line(f"    {y.name} = {x.name} * 2.0")
    m.line("else:")
    m.line(f"    {y.name} = {x.name} + 1.0")
    m.features["Python branch on a shape (torch.export)"] += 1
    return True


BLOCK = '''class Block(nn.Module):
    """A pre-norm residual block: a submodule with children, traced through."""

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc(F.gelu(self.norm(x)))'''


def op_block(m: Model) -> bool:
    """Submodules with children: a Block class of the file, nn.Sequential, an nn.ModuleList."""
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    d = x.shape[-1]
    form = m.rng.choice(["block", "sequential", "modulelist"])
    if form == "block":
        m.classes["Block"] = BLOCK
        call = f"{m.module('block', f'Block({d})', reuse=0.5)}({x.name})"
        m.features["custom Block submodule"] += 1
    elif form == "sequential":
        ctor = f"nn.Sequential(nn.Linear({d}, {d}), nn.ReLU(), nn.Linear({d}, {d}))"
        call = f"{m.module('seq', ctor, reuse=0.5)}({x.name})"
        m.features["nn.Sequential"] += 1
    else:
        layers = m.rng.randint(2, 3)
        ctor = f"nn.ModuleList([nn.Linear({d}, {d}) for _ in range({layers})])"
        stack = m.module("layers", ctor, reuse=0.5)
        y = m.new("f", x.shape, grad=True)
        m.read(x, saved=True)
        m.line(f"{y.name} = {x.name}")
        m.line(f"for layer in {stack}:")
        m.line(f"    {y.name} = torch.tanh(layer({y.name}))")
        m.features["nn.ModuleList loop"] += 1
        return True
    m.read(x, saved=True)
    y = m.new("f", x.shape, grad=True, writable=form == "block")
    m.line(f"{y.name} = {call}")
    return True


def op_unused(m: Model) -> bool:
    """A parameter, buffer or submodule that forward never reads (a pooler left unused)."""
    kind = m.rng.choice(["parameter", "buffer", "submodule"])
    name = m.fresh("unused")
    if kind == "parameter":
        m.init.append(f"self.{name} = nn.Parameter(torch.ones(3))")
    elif kind == "buffer":
        m.init.append(f'self.register_buffer("{name}", torch.ones(3))')
    else:
        m.init.append(f"self.{name} = nn.Linear(3, 3)")
    m.features[f"unused {kind}"] += 1
    return True


def op_no_grad(m: Model) -> bool:
    """A value computed under ``torch.no_grad()`` (a scale): no gradient flows through it."""
    x = m.pick(lambda v: is_float(v) and len(v.shape) >= 1)
    if x is None:
        return False
    s = m.fresh("scale")
    m.line("with torch.no_grad():")
    m.line(f"    {s} = {x.name}.abs().mean(-1, keepdim=True) + 1.0")
    m.read(x, saved=True)
    y = m.new("f", x.shape, grad=x.grad)
    m.line(f"{y.name} = {x.name} / {s}")
    m.features["torch.no_grad() region"] += 1
    return True


OPS: dict[str, tuple[Callable[[Model], bool], float]] = {
    "linear": (op_linear, 6),
    "activation": (op_activation, 4),
    "inplace": (op_inplace, 3),
    "residual": (op_residual, 3),
    "gate": (op_gate, 1.5),
    "cat": (op_cat, 1.5),
    "chunk": (op_chunk, 1.5),
    "layernorm": (op_layernorm, 1.5),
    "batchnorm": (op_batchnorm, 1),
    "conv": (op_conv, 2),
    "pool": (op_pool, 1.5),
    "flatten": (op_flatten, 1.5),
    "unflatten": (op_unflatten, 1),
    "transpose": (op_transpose, 0.7),
    "embedding": (op_embedding, 2),
    "tied_head": (op_tied_head, 1),
    "attention": (op_attention, 1.5),
    "mask": (op_mask, 1.5),
    "apply_mask": (op_apply_mask, 1.5),
    "integer": (op_integer, 1),
    "count": (op_count, 0.5),
    "parameter": (op_parameter, 1),
    "positions": (op_positions, 0.7),
    "broadcast": (op_broadcast, 2),
    "buffer": (op_buffer, 0.7),
    "buffer_update": (op_buffer_update, 0.5),
    "constant": (op_constant, 1),
    "reduce": (op_reduce, 1),
    "softmax": (op_softmax, 0.5),
    "dropout": (op_dropout, 0.7),
    "shape_branch": (op_shape_branch, 0.4),
    "block": (op_block, 1.5),
    "no_grad": (op_no_grad, 0.7),
    "unused": (op_unused, 0.08),
}
