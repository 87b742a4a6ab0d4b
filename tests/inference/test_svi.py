"""Tests of the SVI loop (pyro_gpn.inference.svi)."""

import math
import re
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.optim
import pytest
import torch
from pyro.infer import Trace_ELBO
from pyro.nn import PyroModule, PyroParam, pyro_method
from torch.distributions import constraints

from pyro_gpn.inference.svi import SVIResult, fit_svi
from pyro_gpn.io import load_torch
from pyro_gpn.models.parametric import ParametricGPN


@pytest.fixture(autouse=True)
def _validation():
    pyro.clear_param_store()
    pyro.enable_validation(True)
    yield
    pyro.clear_param_store()


class Gaussian(PyroModule):
    """y_s ~ N(loc, scale^2) with a conjugate latent: loc ~ N(0, 10^2), q(loc) = N(m, s^2).

    The exact posterior is known, so SVI's answer can be checked. The model follows the
    package's contract: ``x`` is a batch of ``num_data`` samples, the data plate is scaled.
    """

    def __init__(self):
        super().__init__()
        self.q_loc = torch.nn.Parameter(torch.tensor(0.0))
        self.q_scale = PyroParam(torch.tensor(1.0), constraints.positive)

    @pyro_method
    def model(self, x, y, num_data=None):
        loc = pyro.sample("loc", dist.Normal(0.0, 10.0))
        size = x.shape[0] if num_data is None else num_data
        with pyro.plate("data", size, subsample=torch.arange(x.shape[0])):
            pyro.sample("y", dist.Normal(loc + x, 0.5), obs=y)

    @pyro_method
    def guide(self, x, y, num_data=None):
        pyro.sample("loc", dist.Normal(self.q_loc, self.q_scale))


def _empty(x, y, num_data=None):
    """An empty guide."""


def _data(num=200):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(num, generator=g)
    y = x + 1.5 + 0.5 * torch.randn(num, generator=g)
    return x, y


def _posterior(x, y):
    precision = 1 / 10.0**2 + x.shape[0] / 0.5**2
    mean = ((y - x).sum() / 0.5**2) / precision
    return mean.item(), precision**-0.5


class TestFit:
    def test_recovers_conjugate_posterior(self):
        x, y = _data()
        m = Gaussian()
        result = fit_svi(m.model, m.guide, x, y, num_steps=300, lr=0.1, seed=0, progress=False)
        assert isinstance(result, SVIResult)
        assert result.num_steps == 300 and len(result.losses) == 300
        assert result.num_data == 200 and result.wall_time > 0
        assert result.final_loss < sum(result.losses[:10]) / 10
        mean, std = _posterior(x, y)
        assert m.q_loc.item() == pytest.approx(mean, abs=0.1)
        # the scale moves from 1 towards the posterior std (0.035); SVI noise keeps it above
        assert m.q_scale.item() < 0.25

    def test_minibatches_and_no_warnings(self):
        x, y = _data()
        m = Gaussian()
        seen, locs = [], []

        def callback(step, loss):
            seen.append(step)
            locs.append(m.q_loc.item())

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = fit_svi(
                m.model,
                m.guide,
                x,
                y,
                num_steps=300,
                lr=0.1,
                batch_size=20,
                seed=0,
                progress=False,
                callback=callback,
            )
        assert seen == list(range(1, 301))
        assert all(math.isfinite(v) for v in result.losses)
        mean, _ = _posterior(x, y)
        # the iterates of a noisy mini-batch run, averaged over the second half
        assert sum(locs[150:]) / 150 == pytest.approx(mean, abs=0.05)

    def test_variational_gpn_with_closed_form_elbo(self):
        """The variational route's deterministic loss and num_data mini-batches run here."""
        from pyro_gpn.inference.closed_form import ClosedFormELBO
        from pyro_gpn.models.variational import VariationalGPN

        torch.manual_seed(0)
        x = torch.linspace(-1, 1, 40).unsqueeze(-1)
        y = torch.sin(2 * x)
        vgpn = VariationalGPN([1, 1], head="gaussian", num_data=40)
        result = fit_svi(
            vgpn.model,
            vgpn.guide,
            x,
            y,
            loss=ClosedFormELBO(vgpn),
            num_steps=30,
            lr=0.05,
            batch_size=10,
            seed=0,
            progress=False,
        )
        assert result.final_loss < sum(result.losses[:5]) / 5

    def test_minibatch_loss_is_unbiased(self):
        """A mini-batch step estimates the full-data loss: the plate scales by S / B."""
        x, y = _data()
        m = Gaussian()
        elbo = Trace_ELBO()
        pyro.set_rng_seed(0)
        full = torch.tensor([elbo.loss(m.model, m.guide, x, y) for _ in range(200)])
        batches = [torch.randperm(200)[:20] for _ in range(200)]
        batch = torch.tensor(
            [elbo.loss(m.model, m.guide, x[i], y[i], num_data=200) for i in batches]
        )
        se = (full.var() / 200 + batch.var() / 200).sqrt()
        assert abs(full.mean() - batch.mean()) < 4 * se

    def test_fit_svi_minibatch_losses_estimate_the_full_data_loss(self):
        """fit_svi passes num_data = S, so each mini-batch loss estimates the full-data loss.

        With a negligible learning rate the parameters stay put, and the recorded losses must
        average to Pyro's own full-data Trace_ELBO (not to a 20-sample loss, ten times smaller).
        """
        x, y = _data()
        m = Gaussian()
        mean, std = _posterior(x, y)  # the exact posterior: a low-variance loss estimate
        m.q_loc = torch.nn.Parameter(torch.tensor(mean))
        m.q_scale = PyroParam(torch.tensor(std), constraints.positive)
        result = fit_svi(
            m.model, m.guide, x, y, num_steps=200, lr=1e-9, batch_size=20, seed=0, progress=False
        )
        assert m.q_loc.item() == pytest.approx(mean, abs=1e-5)
        batch = torch.tensor(result.losses)
        elbo = Trace_ELBO()
        pyro.set_rng_seed(1)
        full = torch.tensor([elbo.loss(m.model, m.guide, x, y) for _ in range(200)])
        se = (full.var() / 200 + batch.var() / 200).sqrt()
        assert abs(full.mean() - batch.mean()) < 4 * se
        # the check has power: a loss of the 20-sample batch alone is far off
        assert abs(full.mean() - batch.mean() / 10) > 50 * se

    def test_seed_reproducible(self):
        x, y = _data()
        runs = []
        for _ in range(2):
            m = Gaussian()
            runs.append(
                fit_svi(
                    m.model, m.guide, x, y, num_steps=20, batch_size=50, seed=3, progress=False
                ).losses
            )
        assert runs[0] == runs[1]

    def test_callback_stops(self):
        x, y = _data()
        m = Gaussian()
        result = fit_svi(
            m.model,
            m.guide,
            x,
            y,
            num_steps=100,
            progress=False,
            callback=lambda step, loss: step == 5,
        )
        assert result.stopped_early and result.num_steps == 5

    def test_progress_bar_and_loss_options(self, capsys):
        x, y = _data(50)
        for loss, kwargs in [
            ("trace", {"num_particles": 3}),
            ("trace_meanfield", {}),
            (Trace_ELBO(num_particles=2), {}),
            (Trace_ELBO().differentiable_loss, {}),  # a plain callable
        ]:
            m = Gaussian()
            result = fit_svi(
                m.model, m.guide, x, y, loss=loss, num_steps=3, progress=True, **kwargs
            )
            assert result.num_steps == 3
        m = Gaussian()
        result = fit_svi(m.model, m.guide, x, y, num_steps=3, clip_norm=1.0, progress=False)
        assert isinstance(result.svi.optim, pyro.optim.PyroOptim)
        assert result.svi.optim.pt_optim_constructor.__name__ == "ClippedAdam"

    def test_lr_decay_reaches_the_requested_factor(self):
        x, y = _data(20)
        m = Gaussian()
        result = fit_svi(
            m.model, m.guide, x, y, num_steps=10, lr=0.1, lr_decay=0.01, progress=False
        )
        lrs = [
            group["lr"]
            for opt in result.svi.optim.optim_objs.values()
            for group in opt.param_groups
        ]
        assert lrs and all(lr == pytest.approx(0.1 * 0.01) for lr in lrs)

    @pytest.mark.parametrize("lr_decay", [0.0, 1.5, math.nan])
    def test_lr_decay_out_of_range_is_refused(self, lr_decay):
        x, y = _data(5)
        m = Gaussian()
        with pytest.raises(ValueError, match="lr_decay"):
            fit_svi(m.model, m.guide, x, y, num_steps=1, lr_decay=lr_decay, progress=False)

    def test_clears_param_store(self):
        pyro.param("stale", torch.tensor(1.0))
        x, y = _data(20)
        m = Gaussian()
        fit_svi(m.model, m.guide, x, y, num_steps=1, progress=False)
        assert "stale" not in pyro.get_param_store()
        pyro.param("stale", torch.tensor(1.0))
        fit_svi(m.model, m.guide, x, y, num_steps=1, progress=False, clear_param_store=False)
        assert "stale" in pyro.get_param_store()

    def test_parametric_gpn_minibatches(self):
        torch.manual_seed(0)
        x = torch.rand(60, 2)
        y = torch.sin(3 * x[:, :1]) + 0.1 * torch.randn(60, 1)
        gpn = ParametricGPN([2, 3, 1], head="gaussian")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = fit_svi(
                gpn.model,
                gpn.guide,
                x,
                y,
                num_steps=60,
                lr=0.03,
                batch_size=16,
                seed=0,
                progress=False,
            )
        assert result.final_loss < sum(result.losses[:10]) / 10


class TestErrors:
    def test_non_finite_loss_leaves_parameters(self):
        def model(x, y, num_data=None):
            loc = pyro.param("loc", torch.tensor(0.5))
            # float32 overflow: a finite observation 1e30 away in units of the scale
            pyro.sample("y", dist.Normal(loc, 1e-10), obs=torch.tensor(1e30))

        with pytest.raises(FloatingPointError, match="loss is inf at step 1"):
            fit_svi(model, _empty, torch.zeros(3), torch.zeros(3), progress=False)
        assert pyro.param("loc").item() == 0.5

    def test_non_finite_gradient_names_parameter(self):
        def model(x, y, num_data=None):
            good = pyro.param("good", torch.tensor(1.0))
            bad = pyro.param("bad", torch.tensor(0.0))
            pyro.factor("f", -(good**2) + bad.sqrt())

        with pytest.raises(FloatingPointError, match=r"gradients at step 1.*\['bad'\]"):
            fit_svi(model, _empty, torch.zeros(3), torch.zeros(3), lr=0.1, progress=False)
        assert pyro.param("good").item() == 1.0  # no update was applied

    def test_argument_errors(self):
        x, y = _data(10)
        m = Gaussian()
        with pytest.raises(ValueError, match="loss"):
            fit_svi(m.model, m.guide, x, y, loss="elbo", progress=False)
        with pytest.raises(ValueError, match="num_particles"):
            fit_svi(m.model, m.guide, x, y, loss=Trace_ELBO(), num_particles=2, progress=False)
        with pytest.raises(ValueError, match="num_particles"):
            fit_svi(m.model, m.guide, x, y, num_particles=0, progress=False)
        with pytest.raises(ValueError, match="lr"):
            fit_svi(m.model, m.guide, x, y, lr=-1.0, progress=False)
        with pytest.raises(ValueError, match="batch_size"):
            fit_svi(m.model, m.guide, x, y, batch_size=0, progress=False)
        with pytest.raises(ValueError, match="num_steps"):
            fit_svi(m.model, m.guide, x, y, num_steps=-1, progress=False)
        with pytest.raises(ValueError, match="y must"):
            fit_svi(m.model, m.guide, x, y[:5], progress=False)
        with pytest.raises(TypeError, match="optim"):
            fit_svi(m.model, m.guide, x, y, optim=torch.optim.Adam, progress=False)

        def plain(x, y):
            pyro.sample("y", dist.Normal(0.0, 1.0).expand([x.shape[0]]).to_event(1), obs=y)

        # the contract: every model takes num_data (fit_svi inspects nothing)
        with pytest.raises(TypeError, match="num_data"):
            fit_svi(plain, lambda x, y: None, x, y, batch_size=5, progress=False)


DT = torch.float64


def _store_model(x, y, num_data=None):
    """Plain ``pyro.param`` sites (the param store), one with a random initial value."""
    shift = pyro.param("shift", lambda: torch.randn((), dtype=DT))
    loc = pyro.sample("loc", dist.Normal(torch.tensor(0.0, dtype=DT), 10.0))
    with pyro.plate("data", num_data or x.shape[0], subsample=torch.arange(x.shape[0])):
        pyro.sample("y", dist.Normal(loc + shift * x, 0.5), obs=y)


def _store_guide(x, y, num_data=None):
    q_loc = pyro.param("q_loc", torch.tensor(0.0, dtype=DT))
    q_scale = pyro.param("q_scale", torch.tensor(1.0, dtype=DT), constraint=constraints.positive)
    pyro.sample("loc", dist.Normal(q_loc, q_scale))


def _noisy_model(x, y, num_data=None, noise=0.5):
    loc = pyro.sample("loc", dist.Normal(torch.tensor(0.0, dtype=DT), 10.0))
    with pyro.plate("data", num_data or x.shape[0], subsample=torch.arange(x.shape[0])):
        pyro.sample("y", dist.Normal(loc + x, noise), obs=y)


def _noisy_guide(x, y, num_data=None, noise=0.5):
    _store_guide(x, y, num_data)


def _kwargs_model(x, y, num_data=None, tags=(), table=None):
    _noisy_model(x, y, num_data)


def _kwargs_guide(x, y, num_data=None, tags=(), table=None):
    _store_guide(x, y, num_data)


def _fit_with_kwargs(out_dir, num_steps, tags, table, **kwargs):
    """``fit_svi`` of ``_kwargs_model`` on 20 rows with ``model_kwargs={"tags", "table"}``."""
    x, y = (t.double() for t in _data(20))
    return fit_svi(
        _kwargs_model,
        _kwargs_guide,
        x,
        y,
        num_steps=num_steps,
        progress=False,
        out_dir=out_dir,
        model_kwargs={"tags": tags, "table": table},
        **kwargs,
    )


def _single_guide(x, y, num_data=None, noise=0.5):
    """_noisy_guide's parameters in float32."""
    q_loc = pyro.param("q_loc", torch.tensor(0.0))
    q_scale = pyro.param("q_scale", torch.tensor(1.0), constraint=constraints.positive)
    pyro.sample("loc", dist.Normal(q_loc, q_scale))


def _fit(kind, num_steps, init_seed=0, **kwargs):
    """A float64 run that exercises every piece of state: Monte Carlo ELBO draws, random
    mini-batches and a randomly initialised parameter (``"store"``: ``pyro.param`` sites,
    ClippedAdam), or a variational GPN's parameters in its ``PyroModule`` with the closed-form
    ELBO (``"vgpn"``, Adam). Returns the trained parameters and the fit."""
    from pyro_gpn.inference.closed_form import ClosedFormELBO
    from pyro_gpn.models.variational import VariationalGPN

    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 1, dtype=DT, generator=g)
    y = torch.sin(2 * x) + 0.1 * torch.randn(40, 1, dtype=DT, generator=g)
    torch.manual_seed(init_seed)  # a resumed run starts from other initial values
    if kind == "store":
        model, guide = _store_model, _store_guide
        args = {"loss": "trace", "num_particles": 2, "clip_norm": 5.0}
        x, y = x[:, 0], y[:, 0]
    else:
        vgpn = VariationalGPN([1, 3, 1], num_data=40, dtype=DT)
        model, guide, args = vgpn.model, vgpn.guide, {"loss": ClosedFormELBO(vgpn)}
    options = {"lr": 0.05, "batch_size": 10, "seed": 3, "progress": False, **args, **kwargs}
    fit = fit_svi(model, guide, x, y, num_steps=num_steps, **options)
    if kind == "store":
        params = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
    else:
        params = {k: v.detach().clone() for k, v in vgpn.state_dict().items()}
    return params, fit


def _assert_same_run(a, b):
    (params_a, fit_a), (params_b, fit_b) = a, b
    assert params_a.keys() == params_b.keys()
    for name, value in params_a.items():
        torch.testing.assert_close(params_b[name], value, rtol=0, atol=1e-10, msg=name)
    assert len(fit_a.losses) == len(fit_b.losses)
    assert fit_b.losses == pytest.approx(fit_a.losses, rel=0, abs=1e-10)


class TestCheckpoints:
    @pytest.mark.parametrize("kind", ["store", "vgpn"])
    def test_resume_equals_uninterrupted_run(self, tmp_path, kind, caplog):
        """N steps straight against N/2, then a resumption to N from another initialisation
        and scrambled generators: the same parameters and losses (float64, 1e-10); resuming
        the finished run again only restores its parameters. A resumption's seed may differ
        (the restored generators replace it), without a warning."""
        straight = _fit(kind, 20)
        _fit(kind, 10, out_dir=tmp_path)
        resumed = _fit(kind, 20, init_seed=99, out_dir=tmp_path, resume=True)
        _assert_same_run(straight, resumed)
        one_step = _fit(kind, 1)[0]
        assert any(not torch.allclose(v, straight[0][k]) for k, v in one_step.items())
        again = _fit(kind, 20, init_seed=7, seed=11, out_dir=tmp_path, resume=True)
        _assert_same_run(straight, again)
        assert not [r for r in caplog.records if r.levelname == "WARNING"]

    def test_periodic_checkpoint_survives_a_crash(self, tmp_path):
        """``checkpoint_every=3`` and a crash (an exception in the callback) at step 7: the
        checkpoint holds step 6 (the crash wrote nothing), verified by its checksum; resuming
        to 12 steps equals an uninterrupted run, the learning-rate decay (optimiser state)
        included."""
        from pyro_gpn.io import load_torch

        def crash(step, loss):
            if step == 7:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            _fit("store", 12, out_dir=tmp_path, checkpoint_every=3, callback=crash, lr_decay=0.5)
        saved = load_torch(tmp_path / "svi_checkpoint.pt")
        assert saved["step"] == 6 and len(saved["losses"]) == 6
        assert sorted(saved["params"]) == ["q_loc", "q_scale", "shift"]
        resumed = _fit(
            "store",
            12,
            init_seed=5,
            out_dir=tmp_path,
            checkpoint_every=3,
            resume=True,
            lr_decay=0.5,
        )
        _assert_same_run(_fit("store", 12, lr_decay=0.5), resumed)
        assert load_torch(tmp_path / "svi_checkpoint.pt")["step"] == 12

    def test_resume_without_checkpoint_starts_afresh(self, tmp_path):
        _assert_same_run(_fit("store", 4), _fit("store", 4, out_dir=tmp_path, resume=True))
        assert (tmp_path / "svi_checkpoint.pt").exists()

    @pytest.mark.parametrize("damage", ["flip", "truncate", "checksum"])
    def test_damaged_checkpoint_names_the_file(self, tmp_path, damage):
        from pyro_gpn.io import CorruptFileError, checksum_path

        _fit("store", 3, out_dir=tmp_path)
        path = tmp_path / "svi_checkpoint.pt"
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
        elif damage == "truncate":
            path.write_bytes(bytes(data[: len(data) // 2]))
        else:
            checksum_path(path).unlink()
        with pytest.raises(CorruptFileError, match=r"svi_checkpoint\.pt.*resume=False"):
            _fit("store", 6, out_dir=tmp_path, resume=True)

    @pytest.mark.parametrize(
        ("changed", "message"),
        [
            ({"lr": 0.1}, "lr=0.1 (checkpoint: 0.05)"),
            ({"batch_size": 20}, "batch_size=20 (checkpoint: 10)"),
            ({"batch_size": None}, "batch_size=None (checkpoint: 10)"),
            ({"clip_norm": 1.0}, "clip_norm=1.0 (checkpoint: 5.0)"),
            ({"lr_decay": 0.5}, "lr_decay=0.5 (checkpoint: 1.0)"),
            ({"num_particles": 3}, "num_particles=3 (checkpoint: 2)"),
            ({"loss": "trace_meanfield"}, "loss='trace_meanfield' (checkpoint: 'trace')"),
            (
                {"optim": pyro.optim.Adam({"lr": 0.05})},
                "optim=\"Adam({'lr': 0.05})\" (checkpoint: None)",
            ),
        ],
    )
    def test_resume_with_other_settings_is_refused(self, tmp_path, changed, message):
        """A resumed run continues the saved one, never a mix: a setting that shapes the
        trajectory must be the checkpoint's, else ValueError names it with both values."""
        _fit("store", 3, out_dir=tmp_path)
        if "optim" in changed:
            changed = {**changed, "clip_norm": None}
        with pytest.raises(ValueError, match=re.escape(message)):
            _fit("store", 6, out_dir=tmp_path, resume=True, **changed)

    def test_num_steps_of_a_decaying_lr_must_not_change(self, tmp_path):
        """The decay spans num_steps: with lr_decay a resumption must keep them (without, a
        longer run continues, test_resume_equals_uninterrupted_run)."""
        _fit("store", 4, out_dir=tmp_path, lr_decay=0.5)
        with pytest.raises(ValueError, match=re.escape("num_steps=8 (checkpoint: 4)")):
            _fit("store", 8, out_dir=tmp_path, resume=True, lr_decay=0.5)

    def test_resume_compares_model_kwargs_and_a_custom_optimiser(self, tmp_path):
        x, y = (t.double() for t in _data(20))

        def run(noise, adam_lr, num_steps=4, **kwargs):
            return fit_svi(
                _noisy_model,
                _noisy_guide,
                x,
                y,
                num_steps=num_steps,
                progress=False,
                out_dir=tmp_path,
                model_kwargs={"noise": noise},
                optim=pyro.optim.Adam({"lr": adam_lr}),
                **kwargs,
            )

        run(0.5, 0.01)
        message = "model_kwargs={'noise': 0.6} (checkpoint: {'noise': 0.5})"
        with pytest.raises(ValueError, match=re.escape(message)):
            run(0.6, 0.01, resume=True)
        message = "optim=\"Adam({'lr': 0.02})\" (checkpoint: \"Adam({'lr': 0.01})\")"
        with pytest.raises(ValueError, match=re.escape(message)):
            run(0.5, 0.02, resume=True)
        # what cannot change the trajectory may: seed, clear_param_store, a longer run; so may
        # lr, which a custom optimiser ignores
        more = run(0.5, 0.01, resume=True, num_steps=6, seed=9, clear_param_store=False, lr=7.0)
        assert more.num_steps == 6

    def test_model_kwargs_torch_cannot_read_fall_back_to_repr(self):
        """``model_kwargs`` values that torch cannot read as plain memory (a string array, a
        meta tensor) are compared by their repr, not a crash of every ``fit_svi`` call."""
        from pyro_gpn.inference.svi import _comparable

        strings = np.array(["a", "b"])
        assert _comparable({"names": strings}) == _comparable({"names": strings.copy()})
        assert _comparable({"names": strings}) != _comparable({"names": np.array(["a", "c"])})
        assert isinstance(_comparable(torch.empty(3, device="meta")), str)

    def test_model_kwargs_compare_by_content(self, tmp_path):
        """Not by repr: a set in another order (as another PYTHONHASHSEED prints it) resumes; a
        change in the middle of a large tensor (which repr shortens) is refused."""
        big = torch.zeros(5000, dtype=torch.float64)
        changed = big.clone()
        changed[2500] = 1.0
        assert repr(big) == repr(changed) and repr({8, 16}) != repr({16, 8})

        def run(tags, table, num_steps=2, **kwargs):
            return _fit_with_kwargs(tmp_path, num_steps, tags=tags, table=table, **kwargs)

        run({8, 16}, big)
        assert run({16, 8}, big.clone(), num_steps=3, resume=True).num_steps == 3
        with pytest.raises(ValueError, match="model_kwargs="):
            run({8, 16}, changed, num_steps=4, resume=True)
        with pytest.raises(ValueError, match="model_kwargs="):
            run({8, 17}, big, num_steps=4, resume=True)

    def test_model_kwargs_with_a_nan_resume_and_a_changed_type_is_refused(self, tmp_path):
        """A NaN in ``model_kwargs`` is the same NaN at resumption (``nan != nan`` refused every
        resumption); ``1`` and ``1.0``, or ``True`` and ``1``, are not the same argument."""

        def run(flag, num_steps, **kwargs):
            table = [math.nan, 2.0, flag]
            return _fit_with_kwargs(tmp_path, num_steps, tags={1}, table=table, **kwargs)

        run(1, 2)
        assert run(1, 3, resume=True).num_steps == 3
        with pytest.raises(ValueError, match=re.escape("model_kwargs=")):
            run(1.0, 4, resume=True)
        with pytest.raises(ValueError, match=re.escape("model_kwargs=")):
            run(True, 4, resume=True)

    def test_same_setting(self):
        from pyro_gpn.inference.checkpoint import same_setting

        assert same_setting({"a": [math.nan, 1]}, {"a": [math.nan, 1]}, strict=True)
        assert not same_setting(math.nan, 1.0) and not same_setting(1.0, math.nan)
        assert same_setting(1, 1.0) and not same_setting(1, 1.0, strict=True)
        assert not same_setting({"a": 1}, {"a": 1, "b": 2}) and not same_setting([1], [1, 2])
        assert not same_setting([True], [1], strict=True) and same_setting((1, 2), [1, 2])

    def test_numpy_scalar_settings_resume(self, tmp_path):
        """An lr of np.float64 (a NumPy scalar, which weights_only=True refuses) is recorded as
        a float: the checkpoint loads, the run resumes, and a Python float counts as the same."""
        _fit("store", 2, out_dir=tmp_path, lr=np.float64(0.05), lr_decay=np.float64(1.0))
        assert type(load_torch(tmp_path / "svi_checkpoint.pt")["settings"]["lr"]) is float
        _, fit = _fit("store", 3, out_dir=tmp_path, resume=True, lr=np.float64(0.05))
        _, again = _fit("store", 4, out_dir=tmp_path, resume=True, lr=0.05)
        assert len(fit.losses) == 3 and len(again.losses) == 4

    def test_checkpoint_of_another_model_is_refused(self, tmp_path):
        x, y = (t.double() for t in _data(20))
        options = {"num_steps": 2, "progress": False, "out_dir": tmp_path}
        fit_svi(_store_model, _store_guide, x, y, **options)
        with pytest.raises(ValueError, match=r"svi_checkpoint\.pt holds the parameters"):
            fit_svi(_noisy_model, _noisy_guide, x, y, resume=True, **options)

    def test_checkpoint_of_another_dtype_is_refused(self, tmp_path):
        """float64 parameters are not silently cast into a float32 model's: the error names
        the parameter and both dtypes."""
        x, y = (t.double() for t in _data(20))
        options = {"num_steps": 2, "progress": False, "out_dir": tmp_path}
        fit_svi(_noisy_model, _noisy_guide, x, y, **options)
        message = r"holds q_\w+ of .*float64.*, the model's is .*float32"
        with pytest.raises(ValueError, match=message):
            fit_svi(_noisy_model, _single_guide, x.float(), y.float(), resume=True, **options)

    @pytest.mark.parametrize(
        ("kwargs", "name"),
        [
            ({"resume": True}, "resume=True needs out_dir"),
            ({"resume": "yes", "out_dir": "x"}, "resume must be a bool"),
            ({"checkpoint_every": 0}, "checkpoint_every"),
            ({"checkpoint_every": 2.5}, "checkpoint_every"),
            ({"checkpoint_every": True}, "checkpoint_every"),
            ({"out_dir": 3}, "out_dir"),
        ],
    )
    def test_bad_checkpoint_arguments_name_the_argument(self, kwargs, name):
        x, y = _data(10)
        m = Gaussian()
        with pytest.raises(ValueError, match=name):
            fit_svi(m.model, m.guide, x, y, num_steps=1, progress=False, **kwargs)


class TestAuditedSettings:
    def test_clip_norm_clamps_every_gradient(self):
        # loss = c_t * theta with c = 100 then 1: clamped to [-1, 1] both gradients are 1, and
        # Adam's bias-corrected steps on a constant gradient are lr each: theta = -2 lr (an
        # unclipped 100 then 1 would give theta = -lr (1 + 0.677))
        slopes = iter([100.0, 1.0])

        def model(x, y, num_data=None):
            theta = pyro.param("theta", torch.tensor(0.0, dtype=torch.float64))
            pyro.factor("f", -next(slopes) * theta)

        x = torch.zeros(3, dtype=torch.float64)
        fit_svi(model, _empty, x, None, num_steps=2, lr=0.1, clip_norm=1.0, progress=False)
        assert pyro.param("theta").item() == pytest.approx(-0.2, rel=1e-6)

    def test_final_loss_is_the_mean_of_the_last_ten_losses(self):
        result = SVIResult(losses=[float(i) for i in range(20)])
        assert result.final_loss == pytest.approx(np.mean(np.arange(10, 20)))
        assert SVIResult(losses=[1.0, 2.0, 6.0]).final_loss == pytest.approx(3.0)


@pytest.mark.parametrize("bad", [0, True, 2.5])
def test_num_steps_must_be_positive(bad):
    """``num_steps=0`` returned an empty loss history (``fit_vgpn`` refuses it too)."""
    x, y = _data(10)
    m = Gaussian()
    with pytest.raises(ValueError, match="num_steps must be a positive integer"):
        fit_svi(m.model, m.guide, x, y, num_steps=bad, progress=False)


@pytest.mark.parametrize("bad", [-1, "a", 1.5, True])
def test_seed_must_be_a_non_negative_integer(bad):
    """A seed of -1 or "a" raised NumPy's or torch's own seeding error."""
    x, y = _data(10)
    m = Gaussian()
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        fit_svi(m.model, m.guide, x, y, num_steps=1, seed=bad, progress=False)
    fit_svi(m.model, m.guide, x, y, num_steps=1, seed=np.int64(3), progress=False)


def _classifiers():
    from pyro_gpn.inference.closed_form import ClosedFormELBO
    from pyro_gpn.models.variational import VariationalGPN

    torch.manual_seed(0)
    vgpn = VariationalGPN([2, 3, 3], head="softmax", num_data=12)
    pgpn = ParametricGPN([2, 3, 3], head="softmax")
    return {
        "vgpn-trace": (vgpn, "trace"),
        "vgpn-closed-form": (vgpn, ClosedFormELBO(vgpn)),
        "pgpn-trace": (pgpn, "trace"),
    }


@pytest.mark.parametrize("shift", [7, -3])
@pytest.mark.parametrize("route", ["vgpn-trace", "vgpn-closed-form", "pgpn-trace"])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_labels_outside_the_heads_classes_are_refused_on_entry(route, shift, batch_size):
    """The loop turns validation off: the closed-form ELBO trained on them silently, and
    ``Trace_ELBO`` raised torch's ``index out of bounds`` from inside ``Categorical``."""
    model, loss = _classifiers()[route]
    gen = torch.Generator().manual_seed(0)
    x, labels = torch.rand(12, 2, generator=gen), torch.randint(0, 3, (12,), generator=gen)
    with pytest.raises(ValueError, match=r"y must hold class labels in \[0, 3\)"):
        fit_svi(
            model.model,
            model.guide,
            x,
            labels + shift,
            loss=loss,
            num_steps=2,
            batch_size=batch_size,
            progress=False,
        )
    fit_svi(model.model, model.guide, x, labels, loss=loss, num_steps=1, progress=False)
