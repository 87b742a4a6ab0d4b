"""Behaviour is unchanged by the refactor of issue 12: fixed seeds give the recorded numbers.

``tests/fixtures/reference_values.json`` was written by :func:`reference_outputs` on ``main``
before the refactor (``python -m tests.test_reference_values``); every route (central-limit
network, variational GPN with the closed-form and the sampled ELBO, parametric GPN by sampling,
the trainer and the SVI loop, the fixed-activation baseline) must reproduce it to round-off.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO

FIXTURE = Path(__file__).parent / "fixtures" / "reference_values.json"


def _flat(value) -> list[float]:
    return [float(v) for v in torch.as_tensor(value).detach().reshape(-1)]


def reference_outputs() -> dict[str, list[float]]:
    """Outputs and losses of every route for fixed seeds (float64, tiny networks)."""
    from pyro_gpn import GPNNet
    from pyro_gpn.inference import ClosedFormELBO, TrainConfig, Trainer, fit_svi
    from pyro_gpn.inference.closed_form import closed_form_elbo
    from pyro_gpn.models import FixedActivationNet, ParametricGPN, VariationalGPN

    torch.set_default_dtype(torch.float64)
    out: dict[str, list[float]] = {}
    gen = torch.Generator().manual_seed(123)
    x = torch.randn(7, 3, generator=gen)
    y_reg = torch.randn(7, 2, generator=gen)
    y_cls = torch.randint(0, 3, (7,), generator=gen)

    for mode in ("mean", "meanvar", "cov"):
        for head, y in (("gaussian", y_reg), ("softmax", y_cls)):
            torch.manual_seed(0)
            sizes = [3, 4, 2] if head == "gaussian" else [3, 4, 3]
            net = GPNNet(sizes, mode=mode, head=head, targets_init="random")
            pred = net(x)
            key = f"gpnnet.{head}.{mode}"
            out[key + ".mean"] = _flat(pred.mean)
            second = pred.cov if pred.cov is not None else pred.var
            out[key + ".second"] = [] if second is None else _flat(second)
            out[key + ".loss"] = _flat(net.loss(x, y))
            out[key + ".penalty"] = _flat(net.penalty())

    for whiten in (False, True):
        for q_cov in ("full", "diag"):
            for head, y in (("gaussian", y_reg), ("softmax", y_cls)):
                pyro.clear_param_store()
                torch.manual_seed(1)
                sizes = [3, 4, 2] if head == "gaussian" else [3, 4, 3]
                vgpn = VariationalGPN(
                    sizes,
                    head=head,
                    q_cov=q_cov,
                    whiten=whiten,
                    num_data=20,
                    targets_init="random",
                    weights="point",  # the recorded values predate q(W)
                )
                key = f"vgpn.{head}.{q_cov}.{int(whiten)}"
                out[key + ".elbo"] = _flat(closed_form_elbo(vgpn, x, y))
                out[key + ".kl"] = _flat(vgpn.kl_divergence())
                pred = vgpn(x)
                out[key + ".pred"] = _flat(pred.mean) + _flat(pred.variance)
                pyro.set_rng_seed(5)
                out[key + ".trace"] = _flat(Trace_ELBO().loss(vgpn.model, vgpn.guide, x, y))

    for likelihood in ("expected", "marginal"):
        for head, y in (("gaussian", y_reg), ("softmax", y_cls)):
            pyro.clear_param_store()
            torch.manual_seed(2)
            sizes = [3, 4, 2] if head == "gaussian" else [3, 4, 3]
            # targets_init: the default before issue 15 (recorded values)
            gpn = ParametricGPN(sizes, head=head, likelihood=likelihood, targets_init="random")
            pyro.set_rng_seed(6)
            key = f"parametric.{head}.{likelihood}"
            out[key + ".trace"] = _flat(Trace_ELBO().loss(gpn.model, gpn.guide, x, y))
            fit = fit_svi(gpn.model, gpn.guide, x, y, num_steps=4, seed=3, progress=False)
            out[key + ".fit"] = fit.losses

    pyro.clear_param_store()
    torch.manual_seed(4)
    vgpn = VariationalGPN(  # the defaults before issue 15 (recorded values)
        [3, 4, 2], head="gaussian", num_data=7, whiten=False, weights="point"
    )
    fit = fit_svi(
        vgpn.model,
        vgpn.guide,
        x,
        y_reg,
        loss=ClosedFormELBO(vgpn),
        num_steps=4,
        batch_size=3,
        seed=3,
        progress=False,
    )
    out["fit_svi.vgpn.closed"] = fit.losses

    torch.manual_seed(5)
    net = GPNNet([3, 4, 2], head="gaussian", targets_init="random")  # the default before 15
    config = TrainConfig(batch_size=3, max_epochs=2, progress=False, lr=1e-2)
    result = Trainer(net, config).fit((x, y_reg), (x, y_reg))
    out["trainer.train_loss"] = [row["train_loss"] for row in result.history]
    out["trainer.val_loss"] = [row["val_loss"] for row in result.history]

    for head, y, sizes in (("gaussian", y_reg, [3, 4, 2]), ("softmax", y_cls, [3, 4, 3])):
        torch.manual_seed(6)
        base = FixedActivationNet(sizes, head=head, dropout=0.2, fast_dropout=True)
        out[f"fixed.{head}.loss"] = _flat(base.loss(x, y))
        out[f"fixed.{head}.mean"] = _flat(base(x).mean)
    return out


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    yield
    torch.set_default_dtype(old)


def test_every_route_reproduces_the_recorded_values(float64):
    expected = json.loads(FIXTURE.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        got = reference_outputs()
    assert set(got) == set(expected)
    for key, values in expected.items():
        torch.testing.assert_close(
            torch.tensor(got[key]), torch.tensor(values), rtol=1e-9, atol=1e-10, msg=key
        )


if __name__ == "__main__":
    values = reference_outputs()
    FIXTURE.write_text(json.dumps(values, indent=0))
    print(f"wrote {len(values)} entries to {FIXTURE}")


V0_1 = Path(__file__).parent / "fixtures" / "v0_1_state_dicts.pt"


@pytest.mark.parametrize(
    "name",
    [
        "gpn_softmax",
        "gpn_gaussian",
        "vgpn_softmax",
        "vgpn_gaussian",
        "fixed_softmax",
        "fixed_gaussian",
    ],
)
def test_v0_1_state_dicts_load_and_predict_the_same(name, float64):
    """State dicts saved by v0.1 (readout, noise and targets in their old places) load."""
    from pyro_gpn import GPNNet
    from pyro_gpn.models import FixedActivationNet, VariationalGPN

    torch.set_default_dtype(torch.float64)
    saved = torch.load(V0_1, weights_only=True)
    build = {
        "gpn_softmax": lambda: GPNNet([3, 4, 3], head="softmax", mode="cov"),
        "gpn_gaussian": lambda: GPNNet([3, 4, 2], head="gaussian", share="layer"),
        "vgpn_softmax": lambda: VariationalGPN(
            [3, 4, 3], head="softmax", whiten=True, weights="point"
        ),
        "vgpn_gaussian": lambda: VariationalGPN(
            [3, 4, 2], head="gaussian", q_cov="diag", whiten=False, weights="point"
        ),
        "fixed_softmax": lambda: FixedActivationNet([3, 4, 3]),
        "fixed_gaussian": lambda: FixedActivationNet([3, 4, 2], head="gaussian"),
    }[name]
    pyro.clear_param_store()
    torch.manual_seed(7)  # not the seed the saved network was built with
    net = build()
    net.load_state_dict(saved[name]["state"])  # strict: every key has a new home
    with torch.no_grad():
        pred = net(saved["x"])
    torch.testing.assert_close(pred.mean, saved[name]["mean"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pred.variance, saved[name]["var"], rtol=1e-10, atol=1e-12)
