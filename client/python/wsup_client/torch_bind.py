"""bind_module: turn a torch.nn.Module built on the meta device into a working
model whose weights are the attached tensors, without copying them.

What a model loader does with it:

    with torch.device("meta"):
        model = LlamaForCausalLM(config)        # no memory for weights
    att = wsup_client.attach(sock, "client", checkpoint_dir=d, backend="cuda")
    if att.from_holder:
        wsup_client.bind_module(model, att.tensors())
    else:
        ...load from disk, record att.reason...

Rules:
- Every parameter and persistent buffer is bound to the tensor of the same
  name (its state_dict key, after `rename`). The tensor object is used as
  it is: the parameter's data pointer is the attached memory. Shapes, and
  dtypes unless check_dtype=False, must match exactly.
- Tied parameters (one Parameter object under several names, e.g. lm_head
  tied to the embeddings) are bound once, from whichever of their names the
  checkpoint holds, and stay tied.
- Non-persistent buffers are not taken from the checkpoint (as Hugging Face
  does; a stale copy there is ignored). Those still on the meta device, such
  as a rotary embedding's inv_freq, are computed by running the owning
  submodule's own __init__ again (on `init_device`, default CPU, as a model
  built normally computes them) with its `config` attribute, and then moved
  to the weights' device, in the dtype that __init__ gives them. A
  submodule without `config`, or with parameters of its own (which a re-run
  would allocate), needs an entry in `materialize`.
- Missing names, extra names, and shape or dtype differences are collected
  and raised together as one BindError listing them; the module is changed
  only when everything checks.
"""

import contextlib
import fnmatch

from ._errors import INVALID_ARGUMENT, WsupError


class BindError(WsupError, ValueError):
    """bind_module refused: the message lists every problem found."""

    def __init__(self, message, missing=(), extra=(), mismatched=(), unmaterialized=()):
        WsupError.__init__(self, message, INVALID_ARGUMENT)
        self.missing = list(missing)
        self.extra = list(extra)
        self.mismatched = list(mismatched)
        self.unmaterialized = list(unmaterialized)


class BindReport:
    """What bind_module did. bound: module name -> checkpoint name; tied:
    (alias, bound-from) pairs; materialized: buffer names computed by
    re-running init; ignored: checkpoint names not bound (non-persistent
    buffers, ignore_extra matches)."""

    def __init__(self):
        self.bound = {}
        self.tied = []
        self.materialized = []
        self.ignored = []

    def __repr__(self):
        return "BindReport(%d bound, %d tied, %d materialized, %d ignored)" % (
            len(self.bound), len(self.tied), len(self.materialized), len(self.ignored))


def _listing(items, limit=12):
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (" and %d more" % (len(items) - limit) if len(items) > limit else "")


@contextlib.contextmanager
def _default_device(torch, device):
    # torch >= 2.0: factory functions inside the block default to `device`
    # (also overriding an enclosing `with torch.device("meta")`).
    if hasattr(torch.device(device), "__enter__"):
        with torch.device(device):
            yield
    else:
        yield


def _slots(module):
    """(kind, owner module, leaf name, full name, tensor, persistent) for every
    parameter and buffer, aliases included."""
    out = []
    for prefix, mod in module.named_modules(remove_duplicate=False):
        pre = prefix + "." if prefix else ""
        for leaf, p in mod._parameters.items():
            if p is not None:
                out.append(("param", mod, leaf, pre + leaf, p, True))
        non_persistent = getattr(mod, "_non_persistent_buffers_set", set())
        for leaf, b in mod._buffers.items():
            if b is not None:
                out.append(("buffer", mod, leaf, pre + leaf, b, leaf not in non_persistent))
    return out


def _reinit_buffers(torch, mod, qualname, device, init_device, materialize):
    """New values for the meta tensors of `mod` (non-persistent buffers and
    plain tensor attributes), computed the way its own __init__ does."""
    custom = None
    if materialize:
        custom = materialize.get(qualname) or materialize.get(type(mod)) or materialize.get(type(mod).__name__)
    if custom is not None:
        with torch.no_grad():
            got = custom(mod, device)
        return {k: v.to(device) for k, v in got.items()}
    config = getattr(mod, "config", None)
    if config is None:
        raise LookupError("%s (%s) has meta buffers but no `config` attribute to re-run its __init__ with; "
                          "pass materialize={%r: fn(module, device) -> {buffer name: tensor}}" %
                          (qualname or "(root)", type(mod).__name__, qualname))
    held = sum(p.numel() for p in mod.parameters())
    if held:
        # Re-running it would allocate all of its parameters (the whole model,
        # for a top-level module) just to compute a buffer.
        raise LookupError("%s (%s) has meta buffers but also %d parameter values, which re-running its "
                          "__init__ would allocate; pass materialize={%r: fn(module, device)}" %
                          (qualname or "(root)", type(mod).__name__, held, qualname))
    with torch.no_grad(), _default_device(torch, init_device):
        try:
            fresh = type(mod)(config)
        except Exception as e:  # noqa: BLE001 - any failure of a foreign __init__ is reported the same way
            raise LookupError("re-running %s(config) for %s failed: %s; pass materialize={%r: fn(module, device)}"
                              % (type(mod).__name__, qualname or "(root)", e, qualname)) from e
    out = {}
    moved = {}  # id of a fresh tensor -> its moved copy, so aliases stay aliases

    def move(t):
        # The dtype __init__ gives (a blanket .to(dtype) of the meta model does
        # not reach it, as it does not in a model built normally).
        key = id(t)
        if key not in moved:
            moved[key] = t.to(device=device)
        return moved[key]

    for leaf, b in mod._buffers.items():
        if b is not None and b.is_meta:
            nb = fresh._buffers.get(leaf)
            if nb is None or nb.is_meta:
                raise LookupError("%s(config) did not make buffer %r; pass materialize={%r: fn(module, device)}"
                                  % (type(mod).__name__, leaf, qualname))
            out[leaf] = move(nb)
    for attr, v in list(vars(mod).items()):
        if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) and v.is_meta:
            nv = vars(fresh).get(attr)
            if isinstance(nv, torch.Tensor) and not nv.is_meta:
                out["@" + attr] = move(nv)
    return out


def bind_module(module, tensors, *, check_dtype=True, rename=None, ignore_extra=(), materialize=None,
                init_device="cpu", device=None):
    """Binds module's parameters and persistent buffers to `tensors` (a
    mapping name -> torch.Tensor, e.g. Attachment.tensors()) and
    materializes its meta non-persistent buffers. Returns a BindReport.

    rename: optional callable, checkpoint name -> module name (or None to
        drop the tensor), for checkpoints whose names differ from the module's.
    ignore_extra: fnmatch patterns of checkpoint names the module need not
        use (anything else left over is an error).
    materialize: {qualified submodule name, class or class name:
        fn(submodule, device) -> {buffer name: tensor}} for submodules whose
        meta buffers cannot be made by re-running __init__(config); a key
        "@name" sets a plain tensor attribute instead of a buffer.
    device: where materialized buffers go (default: the bound tensors' device).
    """
    import torch

    named = {}
    for name, t in tensors.items():
        target = rename(name) if rename is not None else name
        if target is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise BindError("tensor %r is a %s, not a torch.Tensor; attach with Attachment.tensors('torch')"
                            % (name, type(t).__name__))
        named[target] = t

    report = BindReport()
    slots = _slots(module)
    groups = {}  # id(tensor) -> [slot, ...] (aliases)
    order = []
    for s in slots:
        key = (s[0], id(s[4]))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(s)

    missing, mismatched, plan = [], [], []
    consumed = set()
    for key in order:
        group = groups[key]
        kind, persistent = group[0][0], group[0][5]
        names = [s[3] for s in group]
        if kind == "buffer" and not persistent:
            for n in names:
                if n in named:
                    consumed.add(n)
                    report.ignored.append(n)
            continue
        present = [n for n in names if n in named]
        if not present:
            missing.append(names[0] if len(names) == 1 else "%s (tied: %s)" % (names[0], ", ".join(names[1:])))
            continue
        src = present[0]
        t = named[src]
        want = group[0][4]
        consumed.update(present)
        if tuple(t.shape) != tuple(want.shape):
            mismatched.append("%s: checkpoint shape %s, module %s" % (src, list(t.shape), list(want.shape)))
            continue
        if check_dtype and t.dtype != want.dtype:
            mismatched.append("%s: checkpoint dtype %s, module %s" % (src, t.dtype, want.dtype))
            continue
        plan.append((group, src, t))

    extra = sorted(n for n in named if n not in consumed and not any(fnmatch.fnmatchcase(n, p) for p in ignore_extra))
    report.ignored.extend(sorted(n for n in named if n not in consumed and n not in extra))
    if missing or extra or mismatched:
        parts = []
        if missing:
            parts.append("%d missing from the checkpoint: %s" % (len(missing), _listing(missing)))
        if extra:
            parts.append("%d in the checkpoint but not in the module: %s" % (len(extra), _listing(extra)))
        if mismatched:
            parts.append("%d differ: %s" % (len(mismatched), _listing(mismatched)))
        raise BindError("cannot bind %s to the attached tensors: %s. Build the module from the same config "
                        "(and dtype) as the checkpoint; tie weights before binding; use rename= or "
                        "ignore_extra= for names that differ on purpose" %
                        (type(module).__name__, "; ".join(parts)), missing, extra, mismatched)

    if device is None:
        device = plan[0][2].device if plan else torch.device("cpu")

    # Everything checked: meta buffers next (they can still fail), then mutate.
    owners = []
    seen = set()
    for prefix, mod in module.named_modules():
        has_meta = any(b is not None and b.is_meta and leaf in getattr(mod, "_non_persistent_buffers_set", ())
                       for leaf, b in mod._buffers.items())
        has_meta = has_meta or any(isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) and
                                   v.is_meta for v in vars(mod).values())
        if has_meta and id(mod) not in seen:
            seen.add(id(mod))
            owners.append((prefix, mod))
    new_buffers, unmaterialized = [], []
    for prefix, mod in owners:
        try:
            new_buffers.append((prefix, mod, _reinit_buffers(torch, mod, prefix, device, init_device, materialize)))
        except LookupError as e:
            unmaterialized.append(str(e))
    if unmaterialized:
        raise BindError("cannot materialize the meta buffers of %s: %s" % (type(module).__name__,
                                                                         "; ".join(unmaterialized)),
                        unmaterialized=unmaterialized)

    for group, src, t in plan:
        kind = group[0][0]
        value = torch.nn.Parameter(t, requires_grad=False) if kind == "param" else t
        for s in group:
            mod, leaf, full = s[1], s[2], s[3]
            if kind == "param":
                mod._parameters[leaf] = value
            else:
                mod._buffers[leaf] = value
            report.bound[full] = src
            if full != src:
                report.tied.append((full, src))
    for prefix, mod, values in new_buffers:
        pre = prefix + "." if prefix else ""
        for leaf, v in values.items():
            if leaf.startswith("@"):
                object.__setattr__(mod, leaf[1:], v)
            else:
                mod._buffers[leaf] = v
            report.materialized.append(pre + leaf.lstrip("@"))

    left = [s[3] for s in _slots(module) if s[4].is_meta]
    if left:
        raise BindError("after binding, still on the meta device: %s; pass materialize= for their modules"
                        % _listing(left), unmaterialized=left)
    return report
