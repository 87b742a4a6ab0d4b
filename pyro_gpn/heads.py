r"""Heads: the likelihood at the top of a network, as objects.

A head turns the moments (or one draw) of the *features* -- what the last GPN layer hands up --
into everything that depends on the kind of target:

==========================  ================================  ==================================
                            :class:`GaussianHead`             :class:`SoftmaxHead`
==========================  ================================  ==================================
features                    noise-free responses ``F^L``      outputs ``X^L`` (noise included)
parameters                  observation noise ``sigma``       readout ``W^{L+1} [N_L, C]``, ``b``
:meth:`~Head.predictive`    ``N(mean, var + sigma^2)``        logit moments ``X W + b``
:meth:`~Head.expected_nll`  ``eq:gpn_reg_loss_marginal_final`` ``eq:gpn_normal_unscented``
:meth:`~Head.observe`       ``y ~ N(F, sigma^2)``             ``y ~ Categorical(X W + b)``
:meth:`~Head.predict`       mean and std                      class probabilities and their std
==========================  ================================  ==================================

:class:`HeteroscedasticGaussianHead` is the Gaussian head with input-dependent noise: its
features are ``2 D`` noise-free responses (the outputs and the noise features ``H``), the log
noise variance ``a + b H``; pass an instance (``head=HeteroscedasticGaussianHead(D)``).

Every network (:class:`~pyro_gpn.GPNNet`, the Pyro models, the fixed-activation baselines) calls
these methods and never asks which head it has. A new likelihood (ordinal, Poisson, ...) is a
new subclass of :class:`Head`, as :class:`StudentTHead` is (heavy-tailed noise for targets with
outliers: ``head=StudentTHead(D, df=4)``). Networks accept the names ``"gaussian"`` and
``"softmax"`` and build the head with :func:`make_head`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyro
import pyro.distributions as dist
import torch
from torch import Tensor, nn

from ._validation import check_finite, check_shape, check_tensor, integer_sizes
from .losses import (
    _check_reduction,
    _reduce,
    _student_t_gauss_hermite_nll,
    check_labels,
    check_student_t_df,
    gaussian_expected_nll,
    gaussian_mixture_log_density,
    heteroscedastic_expected_nll,
    heteroscedastic_log_noise_moments,
    student_t_expected_nll,
    student_t_scale_mixture,
    unscented_cross_entropy,
    unscented_log_predictive,
    unscented_logits,
)
from .moments.gaussian import Moments
from .moments.quadrature import gauss_hermite

__all__ = [
    "HEADS",
    "GaussianHead",
    "Head",
    "HeteroscedasticGaussianHead",
    "Prediction",
    "SoftmaxHead",
    "StudentTHead",
    "check_sizes",
    "make_head",
]


@dataclass(frozen=True, eq=False)
class Prediction:
    """What ``predict`` returns on every route.

    Attributes:
        mean: regression: the predictive mean ``[S, D]``; classification: the predictive class
            probabilities ``[S, C]`` (also as :attr:`probs`).
        std: its uncertainty, same shape: the predictive standard deviation (regression) or the
            standard deviation of the class probabilities under the posterior (classification).
        task: ``"regression"`` or ``"classification"``.
    """

    mean: Tensor
    std: Tensor
    task: str

    @property
    def probs(self) -> Tensor:
        """The class probabilities ``[S, C]`` (classification only)."""
        if self.task != "classification":
            raise AttributeError("probs exists for classification predictions only")
        return self.mean


class Head(nn.Module):
    """The likelihood of the targets given the features; see the module docstring.

    A plain ``torch.nn.Module``: inside a Pyro model its parameters are registered as
    ``pyro.module`` parameters of the model, and outside one it never touches Pyro's param store.
    Subclasses set :attr:`task`, :attr:`noisy_features` (the last GPN layer adds its output noise
    before the head) and :attr:`has_readout` (``sizes`` ends with the head's own width, e.g. the
    classes of a softmax readout), and implement the abstract methods.
    """

    task: str = ""
    noisy_features: bool = True
    has_readout: bool = False

    @classmethod
    def feature_sizes(cls, sizes: Sequence[int]) -> list[int]:
        """The widths of the layers below the head, from a network's ``sizes``."""
        sizes = list(sizes)
        return sizes[:-1] if cls.has_readout else sizes

    def check_target(self, y: Tensor, num_samples: int) -> None:
        """Raise ``ValueError`` naming ``y`` unless it fits ``num_samples`` predictions."""
        raise NotImplementedError

    def predictive(self, features: Moments) -> Moments:
        """Moments of the predictive quantity (outputs or logits), ``[S, D | C]``."""
        raise NotImplementedError

    def expected_nll(self, features: Moments, y: Tensor, reduction: str = "mean") -> Tensor:
        """``E[-log p(y | features)]`` under the features' Gaussian, reduced over samples."""
        raise NotImplementedError

    def observation(self, features: Tensor) -> dist.Distribution:
        """``p(y | features)`` for one draw of the features ``[..., S, N_L]``."""
        raise NotImplementedError

    def observe(self, name: str, features: Tensor, y: Tensor | None) -> Tensor:
        """The Pyro observation site ``name`` (inside the caller's data plate)."""
        return pyro.sample(name, self.observation(features), obs=y)

    def predict(self, features: Moments) -> Prediction:
        """:class:`Prediction` from the features' moments, in closed form."""
        raise NotImplementedError

    def log_predictive(self, features: Moments, y: Tensor, calibrated: bool = True) -> Tensor:
        """``log p(y_s | x_s)`` per sample ``[S]`` under the closed-form predictive (the test
        log-likelihood and the validation score of the fits); ``calibrated=False`` ignores the
        predictive scale (a training objective's data term: training never sees it)."""
        raise NotImplementedError

    def predict_draws(self, samples: Mapping[str, Tensor], obs_site: str) -> Prediction:
        """:class:`Prediction` from Monte Carlo draws ``[K, S, ...]`` of a model's sites."""
        raise NotImplementedError

    def _init_predictive_scale(self, width: int, factory: dict) -> None:
        """Register the calibration buffer ``predictive_scale`` ``[width]``, 1 (none)."""
        self.register_buffer("predictive_scale", torch.ones(width, **factory))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # a state saved before the predictive scale existed is an uncalibrated head
        if "predictive_scale" in self._buffers:
            state_dict.setdefault(
                prefix + "predictive_scale", torch.ones_like(self.predictive_scale)
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class _RegressionHead(Head):
    """What the Gaussian regression heads share: targets ``[S, D]``, the prediction from the
    predictive's moments, the log density of :meth:`predictive_mixture`, Monte Carlo
    predictions from the observation site's draws, and the predictive's calibration scale.

    **Predictive scale** (buffer ``predictive_scale`` ``[D]``, 1 unless calibrated): the
    predictive distribution of a new ``y`` is that of ``m + s (y - m)``, ``m`` its mean, ``s``
    the scale: every mixture component's mean moves to ``s mu_k + (1 - s) m`` and its variance
    to ``s^2 var_k``, so the predictive variance is ``s^2`` times the model's. It is the
    ``sigma``-scaling recalibration of Laves et al. (2020), fitted after training on held-out
    rows by :func:`pyro_gpn.inference.fit_predictive_scale` (``fit_vgpn(..., calibrate=True)``).
    Only the predictive (:meth:`predictive`, :meth:`predictive_mixture`, :meth:`predict`,
    :meth:`log_predictive`) uses it; the training objectives (:meth:`expected_nll`, the
    observation site) do not. A scale of 1 changes no bit of the predictive.
    """

    task = "regression"
    noisy_features = False
    has_readout = False
    num_outputs: int
    predictive_scale: Tensor

    def _scaled_mixture(
        self, weights: Tensor, mean: Tensor, var: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The mixture ``(weights [K], mean [K, S, D], var [K, S, D])`` scaled about its mean
        by :attr:`predictive_scale` (class docstring)."""
        scale = self.predictive_scale.to(mean.dtype)
        centre = torch.einsum("k,ksd->sd", weights.to(mean.dtype), mean)
        return weights, scale * mean + (1 - scale) * centre, scale.square() * var

    def check_target(self, y: Tensor, num_samples: int) -> None:
        check_tensor("y", y)
        check_shape("y", y, (num_samples, self.num_outputs))
        check_finite("y", y)

    def predictive_mixture(
        self, features: Moments, calibrated: bool = True
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The predictive as a Gaussian mixture: weights ``[K]`` and component means and
        variances ``[K, S, D]`` (``calibrated=False``: at scale 1)."""
        raise NotImplementedError

    def predict(self, features: Moments) -> Prediction:
        predictive = self.predictive(features)
        return Prediction(predictive.mean, predictive.variance.sqrt(), self.task)

    def log_predictive(self, features: Moments, y: Tensor, calibrated: bool = True) -> Tensor:
        mixture = self.predictive_mixture(features, calibrated=calibrated)
        return gaussian_mixture_log_density(*mixture, y)

    def predict_draws(self, samples: Mapping[str, Tensor], obs_site: str) -> Prediction:
        draws = samples[obs_site]
        return Prediction(draws.mean(0), draws.std(0), self.task)


class GaussianHead(_RegressionHead):
    """Regression: ``y = F + eps``, ``eps ~ N(0, diag(sigma^2))``.

    Args:
        num_outputs: ``D``, the width of the targets (and of the last GPN layer).
        noise_std_init: initial observation noise standard deviation ``sigma``.
        shared: one ``sigma`` for all outputs (``[1]``; the network's ``share="layer"``).
        dtype, device: of the parameter.

    Attributes:
        noise_std: ``[D | 1]``, positive, the observation noise (paper: ``sigma^L``, the noise
            of the last GPN layer); ``exp`` of the parameter ``noise_std_unconstrained``.
        predictive_scale: ``[D]`` buffer, the predictive's calibration scale (1: none; see
            the regression heads' base class).
    """

    def __init__(
        self,
        num_outputs: int,
        noise_std_init: float = 0.1,
        shared: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(num_outputs, int) or num_outputs < 1:
            raise ValueError(f"num_outputs must be a positive integer, got {num_outputs!r}")
        if not (math.isfinite(noise_std_init) and noise_std_init > 0):
            raise ValueError(f"noise_std_init must be positive and finite, got {noise_std_init}")
        self.num_outputs = num_outputs
        factory = {"dtype": dtype or torch.get_default_dtype(), "device": device}
        width = 1 if shared else num_outputs
        noise_std = torch.full((width,), float(noise_std_init), **factory)
        self.noise_std_unconstrained = nn.Parameter(noise_std.log())
        self._init_predictive_scale(self.num_outputs, factory)

    @property
    def noise_std(self) -> Tensor:
        return self.noise_std_unconstrained.exp()

    def predictive(self, features: Moments) -> Moments:
        return self._predictive(features, calibrated=True)

    def _predictive(self, features: Moments, calibrated: bool) -> Moments:
        """The predictive moments, ``F + eps`` times the predictive scale about the mean
        (``calibrated=False``: at scale 1)."""
        noise_var = self.noise_std.square().expand(features.num_features)
        if not calibrated:
            if features.cov is not None:
                cov = features.cov + torch.diag(noise_var)
                return Moments(features.mean, cov=cov, validate=False)
            return Moments(features.mean, var=features.variance + noise_var, validate=False)
        scale = self.predictive_scale.to(features.mean.dtype)
        if features.cov is not None:
            cov = (features.cov + torch.diag(noise_var)) * torch.outer(scale, scale)
            return Moments(features.mean, cov=cov, validate=False)
        var = (features.variance + noise_var) * scale.square()
        return Moments(features.mean, var=var, validate=False)

    def expected_nll(self, features: Moments, y: Tensor, reduction: str = "mean") -> Tensor:
        return gaussian_expected_nll(features, y, self.noise_std, reduction=reduction)

    def observation(self, features: Tensor) -> dist.Distribution:
        return dist.Normal(features, self.noise_std).to_event(1)

    def marginal_observation(self, mean: Tensor, var: Tensor) -> dist.Distribution:
        """``p(y) = N(mean, var + sigma^2)`` for Gaussian features ``N(mean, var)``."""
        scale = (var + self.noise_std.square()).sqrt()
        return dist.Normal(mean, scale).to_event(1)

    def predictive_mixture(
        self, features: Moments, calibrated: bool = True
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The predictive as a Gaussian mixture: weights ``[K]`` and component means and
        variances ``[K, S, D]``; here one component, ``N(mean, var + sigma^2)``."""
        predictive = self._predictive(features, calibrated)
        one = predictive.mean.new_ones(1)
        return one, predictive.mean.unsqueeze(0), predictive.variance.unsqueeze(0)

    def extra_repr(self) -> str:
        return f"num_outputs={self.num_outputs}"


class SoftmaxHead(Head):
    """Classification: logits ``A = X W + b`` of the features, ``y ~ Categorical(A)``.

    The expected cross-entropy uses the unscented transform with sigma points in the space of
    the features (:func:`~pyro_gpn.losses.unscented_cross_entropy`); so does :meth:`predict`,
    which averages the softmax over the same points.

    **Temperature** (buffer ``predictive_scale`` ``[1]``, 1 unless calibrated): the predictive
    divides every point's logits by ``T``, the temperature scaling of Guo et al. (2017, "On
    calibration of modern neural networks"): ``T > 1`` softens the class probabilities,
    ``T < 1`` sharpens them, the most probable class of each point stays. It is fitted after
    training on held-out rows by :func:`pyro_gpn.inference.fit_predictive_scale`
    (``fit_vgpn(..., calibrate=True)``); as the regression heads' scale, only the predictive
    (:meth:`predictive`, :meth:`predict`, :meth:`log_predictive`) uses it, the training
    objectives do not, and ``T = 1`` changes no bit.

    Args:
        in_features: ``N_L``, the width of the last GPN layer.
        num_classes: ``C``.
        unscented_kappa: ``kappa`` of the unscented transform (``None``: 0, see
            :func:`~pyro_gpn.losses.unscented_cross_entropy`; the paper: ``3 - N_L``).
        dtype, device: of the parameters.

    Attributes:
        weight: ``[N_L, C]`` readout (the layout of every weight in the library: ``x @ W``),
            Glorot-uniform; drawn as the first release's ``torch.nn.Linear`` readout was, so
            that fixed seeds give the same networks.
        bias: ``[C]``, zero.
        predictive_scale: ``[1]`` buffer, the temperature ``T`` (1: none; see above).
    """

    task = "classification"
    noisy_features = True
    has_readout = True

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        unscented_kappa: float | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("num_classes", num_classes)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.in_features = in_features
        self.num_classes = num_classes
        self.unscented_kappa = unscented_kappa
        factory = {"dtype": dtype or torch.get_default_dtype(), "device": device}
        linear = nn.Linear(in_features, num_classes, **factory)  # the random stream of v0.1
        nn.init.xavier_uniform_(linear.weight)
        self.weight = nn.Parameter(linear.weight.detach().mT.contiguous())
        self.bias = nn.Parameter(torch.zeros(num_classes, **factory))
        self._init_predictive_scale(1, factory)

    @property
    def num_outputs(self) -> int:
        return self.num_classes

    def readout(self, features: Tensor) -> Tensor:
        """The logits ``features @ W + b``, ``[..., C]``."""
        return features @ self.weight + self.bias

    def check_target(self, y: Tensor, num_samples: int) -> None:
        check_labels(y, num_samples, self.num_classes, name="y")

    def predictive(self, features: Moments) -> Moments:
        """Logit moments; a full covariance unless the features are a point mass (the readout
        correlates even independent features)."""
        temperature = self.predictive_scale.to(features.mean.dtype)
        if features.is_deterministic:
            return features.linear(self.weight / temperature, self.bias / temperature)
        return features.linear_full(self.weight / temperature, self.bias / temperature)

    def expected_nll(self, features: Moments, y: Tensor, reduction: str = "mean") -> Tensor:
        return unscented_cross_entropy(
            features, y, self.weight, self.bias, kappa=self.unscented_kappa, reduction=reduction
        )

    def observation(self, features: Tensor) -> dist.Distribution:
        return dist.Categorical(logits=self.readout(features))

    def observe(self, name: str, features: Tensor, y: Tensor | None) -> Tensor:
        """Records the logits as the deterministic site ``"logits"`` and observes ``name``."""
        logits = pyro.deterministic("logits", self.readout(features), event_dim=1)
        return pyro.sample(name, dist.Categorical(logits=logits), obs=y)

    def point_logits(self, features: Moments) -> tuple[Tensor, Tensor]:
        """The logits at the unscented sigma points of the features, at temperature 1, and the
        points' weights: ``[S, P, C]`` and ``[P]`` (``P = 2 N + 1``; a point mass: ``P = 1``)."""
        logits, weights = unscented_logits(features, self.weight, self.bias, self.unscented_kappa)
        if features.is_deterministic:
            return logits[:, :1], weights.new_ones(1)
        return logits, torch.cat([weights[:1], weights[1:].expand(logits.shape[1] - 1)])

    def predict(self, features: Moments) -> Prediction:
        """Softmax of the logits over the temperature, averaged over the unscented sigma points
        of the features (their mean and standard deviation); a point mass gives the softmax of
        its logits and zero std."""
        logits, point_weights = self.point_logits(features)
        probs = (logits / self.predictive_scale.to(logits.dtype)).softmax(-1)  # [S, P, C]
        point_weights = point_weights.view(1, -1, 1)
        mean = (point_weights * probs).sum(1)
        var = (point_weights * (probs - mean.unsqueeze(1)).square()).sum(1)
        return Prediction(mean, var.clamp_min(0).sqrt(), self.task)

    def predict_draws(self, samples: Mapping[str, Tensor], obs_site: str) -> Prediction:
        probs = samples["logits"].softmax(-1)
        return Prediction(probs.mean(0), probs.std(0), self.task)

    def log_predictive(self, features: Moments, y: Tensor, calibrated: bool = True) -> Tensor:
        """``log sum_i w_i softmax(A_i / T)[y]`` over the sigma points ``A_i``
        (:func:`~pyro_gpn.losses.unscented_log_predictive`: a log-sum-exp, finite where a
        probability underflows, on the fused CPU kernel where it runs); ``calibrated=False``:
        at ``T = 1``."""
        temperature = self.predictive_scale if calibrated else 1.0
        return unscented_log_predictive(
            features, y.long(), self.weight, self.bias, self.unscented_kappa, temperature
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, num_classes={self.num_classes}"


#: Gauss-Hermite nodes over ``F | G`` of the heteroscedastic head's expected t log-likelihood:
#: relative error 1e-7 where ``sd(F | G)`` equals the noise scale, 1e-4 at twice it, 5e-3 at
#: four times (against nested ``quad``; trained networks have ``sd(F | G)`` below the noise)
_T_NODES_GIVEN_G = 20
#: Gauss-Hermite nodes over ``G`` of the same expectation (at most ``num_nodes``): relative
#: error 2.7e-4 against 2.1e-5 at 64 in the hardest rows of ``benchmarks/student_t_cost.py
#: accuracy`` (``sd(G)`` up to 1.5), below the 5e-3 of the nodes over ``F | G`` there, at a
#: quarter of the cost (a step 1.26x the Gaussian head's instead of 3.1x; uci.md section 24)
_T_NODES_OVER_G = 16


class _StudentTNoise(nn.Module):
    """Student-t noise as a Gaussian scale mixture
    (:func:`~pyro_gpn.losses.student_t_scale_mixture`), for the heads that offer it: the
    mixture's log weights and variance factors (non-persistent buffers, rebuilt from ``df``) and
    ``df`` itself, saved with the state as the buffer ``degrees_of_freedom`` so that a state
    fitted under one ``nu`` never loads into another."""

    df: float | None

    def _init_student_t(self, df: float, factory: dict) -> None:
        self.df = check_student_t_df(df)
        log_weights, factors = student_t_scale_mixture(self.df, **factory)
        self.register_buffer("mixture_log_weights", log_weights, persistent=False)
        self.register_buffer("mixture_var_factors", factors, persistent=False)
        self.register_buffer("degrees_of_freedom", torch.tensor(self.df, dtype=torch.float64))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        saved = state_dict.get(prefix + "degrees_of_freedom")
        if saved is not None and self.df is not None and float(saved) != self.df:
            raise ValueError(
                f"the state was fitted with df={float(saved):g}, this head has df={self.df:g}"
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _scale_mixture(self, mean: Tensor, var: Tensor, noise_var: Tensor):
        """Log weights ``[L]`` and component means and variances ``[L, ...]`` of ``N(mean, var)``
        plus t noise of squared scale ``noise_var`` (each ``[...]``): ``var + c_l noise_var``."""
        dtype = mean.dtype
        shape = (-1,) + (1,) * var.dim()
        var = var.unsqueeze(0) + noise_var * self.mixture_var_factors.to(dtype).view(shape)
        return self.mixture_log_weights.to(dtype), mean.unsqueeze(0).expand_as(var), var

    def _log_predictive_mixture(self, log_weights, mean, var, y, calibrated: bool) -> Tensor:
        """The log density of ``y`` under a mixture given by its log weights (which float32
        keeps where the weights underflow: below 1e-45, at ``nu >= 20`` the density from about
        300 scales out), calibrated as :meth:`_RegressionHead._scaled_mixture`."""
        if calibrated:
            _, mean, var = self._scaled_mixture(log_weights.exp(), mean, var)
        return gaussian_mixture_log_density(log_weights, mean, var, y, log_weights=True)


class HeteroscedasticGaussianHead(_StudentTNoise, _RegressionHead):
    """Regression with input-dependent noise: ``y = F + eps``, ``eps ~ N(0, exp(G))``, where
    the network outputs both ``F`` and the noise features ``H`` and ``G = a + b H`` is the log
    noise variance (DVI's heteroscedastic likelihood; Wu et al. 2019).

    The last GPN layer has ``2 D`` units: the first ``D`` are the outputs, the last ``D`` the
    noise features, so ``VariationalGPN([M, 50, 1], head=HeteroscedasticGaussianHead(1))`` has
    layers ``M -> 50 -> 2``. The affine map ``a + b H`` (``a``, ``b`` learned per output) lets
    the log variance leave the range of a GPN unit's output (about ``[-2, 2]``).

    * :meth:`expected_nll`: :func:`~pyro_gpn.losses.heteroscedastic_expected_nll`, exact given
      the features' moments.
    * :meth:`predictive_mixture`: the predictive ``p(y) = E_G[N(y | E[F | G], Var[F | G] +
      e^G)]`` as a Gauss-Hermite mixture over ``G`` (``num_nodes`` components; 64 reach 1e-7
      relative in the log density where the log variance's standard deviation is 1.3 and its
      correlation with ``F`` 0.9, against scipy's ``dblquad``).
    * :meth:`predictive` / :meth:`predict`: its mean and variance,
      ``Var[F] + exp(E[G] + Var[G] / 2)`` (moment-matched).

    **Noise floor** (``noise_floor = c > 0``): the noise variance is ``c^2 + exp(G)``, so the
    input-dependent part can only add to a fixed level and the predictive's standard deviation
    never falls below ``c``, wherever ``H`` goes (inputs far from the training rows, where point
    weights extrapolate; ``docs/results/uci.md`` section 13). :meth:`expected_nll` is then the
    same expectation by Gauss-Hermite quadrature over ``G`` (``num_nodes`` nodes, ``F | G``
    Gaussian as in the predictive mixture) instead of the closed form; ``c = 0`` (the default)
    is the head without a floor, closed form.

    **Student-t noise** (``df = nu``): ``eps ~ t_nu(0, sqrt(c^2 + e^G))``, heavy-tailed noise
    whose scale follows the input (:class:`StudentTHead` is the homoscedastic one). A target
    far from the mean costs ``(nu + 1) log |r|`` nats instead of ``r^2 / 2``, also where the
    fitted noise has narrowed onto a few training targets. :meth:`expected_nll` is then the
    expectation by Gauss-Hermite quadrature over ``G`` (16 nodes, at most ``num_nodes``) and
    over ``F | G`` (20 nodes) of the t's log density; :meth:`predictive_mixture` the
    Gauss-Hermite mixture over ``G`` with each node's t written as its Gaussian scale mixture
    (``num_nodes x K`` components, ``K`` = 90 at ``nu = 4``: memory ``num_nodes x K x S x D``,
    meant for the small sets where outliers matter); :meth:`predictive`'s noise variance is
    multiplied by ``nu / (nu - 2)``. ``None`` (the default) is the Gaussian head.

    Args:
        num_outputs: ``D``.
        noise_std_init: the initial noise standard deviation where ``H = 0``
            (``a = 2 log noise_std_init``; with ``df``, the initial t scale).
        noise_slope_init: the initial ``b``.
        num_nodes: Gauss-Hermite nodes of the predictive mixture (and of the expected
            log-likelihood with a noise floor).
        noise_floor: ``c >= 0``, the smallest noise standard deviation (in the targets'
            units): the noise variance is ``c^2 + exp(G)``; 0: no floor.
        df: ``nu`` of Student-t noise (``2.5 <= nu <= 100``), or ``None``: Gaussian noise.
        dtype, device: of the parameters.

    Attributes:
        noise_offset: ``[D]`` ``a``.
        noise_slope: ``[D]`` ``b``.
        in_features: ``2 D``, the width of the last GPN layer.
        noise_floor: ``c`` (a float, not learned).
        predictive_scale: ``[D]`` buffer, the predictive's calibration scale (1: none; see
            the regression heads' base class).
    """

    def __init__(
        self,
        num_outputs: int,
        noise_std_init: float = 0.1,
        noise_slope_init: float = 0.5,
        num_nodes: int = 64,
        noise_floor: float = 0.0,
        df: float | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if not (
            isinstance(noise_floor, (int, float))
            and not isinstance(noise_floor, bool)
            and math.isfinite(noise_floor)
            and noise_floor >= 0
        ):
            raise ValueError(f"noise_floor must be a finite number >= 0, got {noise_floor!r}")
        self.noise_floor = float(noise_floor)
        for name, value in (("num_outputs", num_outputs), ("num_nodes", num_nodes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (math.isfinite(noise_std_init) and noise_std_init > 0):
            raise ValueError(f"noise_std_init must be positive and finite, got {noise_std_init}")
        if not math.isfinite(noise_slope_init):
            raise ValueError(f"noise_slope_init must be finite, got {noise_slope_init}")
        self.num_outputs = num_outputs
        self.in_features = 2 * num_outputs
        self.num_nodes = num_nodes
        factory = {"dtype": dtype or torch.get_default_dtype(), "device": device}
        offset = torch.full((num_outputs,), 2.0 * math.log(noise_std_init), **factory)
        self.noise_offset = nn.Parameter(offset)
        self.noise_slope = nn.Parameter(
            torch.full((num_outputs,), float(noise_slope_init), **factory)
        )
        self.df = None
        if df is not None:
            self._init_student_t(df, factory)
        self._init_predictive_scale(self.num_outputs, factory)

    @classmethod
    def feature_sizes(cls, sizes: Sequence[int]) -> list[int]:
        """``[M, N_1, ..., 2 D]``: the last GPN layer carries the outputs and the noise
        features."""
        sizes = list(sizes)
        return [*sizes[:-1], 2 * sizes[-1]]

    def _moments(self, features: Moments):
        return heteroscedastic_log_noise_moments(features, self.noise_offset, self.noise_slope)

    def predictive(self, features: Moments) -> Moments:
        mean, var, g_mean, g_var, _ = self._moments(features)
        noise_var = (g_mean + g_var / 2).exp() + self.noise_floor**2
        if self.df is not None:
            noise_var = noise_var * (self.df / (self.df - 2))
        scale = self.predictive_scale.to(mean.dtype)
        return Moments(mean, var=(var + noise_var) * scale.square(), validate=False)

    def expected_nll(self, features: Moments, y: Tensor, reduction: str = "mean") -> Tensor:
        """``E[-log N(y | F, c^2 + e^G)]`` summed over outputs, reduced over samples: in
        closed form without a floor (:func:`~pyro_gpn.losses.heteroscedastic_expected_nll`),
        by Gauss-Hermite quadrature over ``G`` with one (class docstring); with Student-t noise
        ``E[-log t_nu(y - F | 0, sqrt(c^2 + e^G))]``, by Gauss-Hermite quadrature over ``G``
        and ``F | G``."""
        if self.noise_floor == 0 and self.df is None:
            return heteroscedastic_expected_nll(
                features, y, self.noise_offset, self.noise_slope, reduction=reduction
            )
        _check_reduction(reduction)
        self.check_target(y, features.mean.shape[0])
        num_nodes = min(self.num_nodes, _T_NODES_OVER_G) if self.df is not None else None
        w, comp_mean, cond_var, noise_var = self._nodes(features, num_nodes)
        y = y.to(comp_mean.dtype)
        if self.df is not None:
            per_node = _student_t_gauss_hermite_nll(
                comp_mean, cond_var, y, noise_var.sqrt(), self.df, _T_NODES_GIVEN_G
            )  # [K, S, D]
            return _reduce(torch.einsum("k,ksd->s", w, per_node), reduction)
        per_node = 0.5 * (
            math.log(2 * math.pi)
            + noise_var.log()
            + ((y - comp_mean).square() + cond_var) / noise_var
        )  # [K, S, D]
        return _reduce(torch.einsum("k,ksd->s", w, per_node), reduction)

    def observation(self, features: Tensor) -> dist.Distribution:
        num = self.num_outputs
        log_var = self.noise_offset + self.noise_slope * features[..., num:]
        scale = (log_var.exp() + self.noise_floor**2).sqrt()
        if self.df is not None:
            return dist.StudentT(self.df, features[..., :num], scale).to_event(1)
        return dist.Normal(features[..., :num], scale).to_event(1)

    def predictive_mixture(
        self, features: Moments, calibrated: bool = True
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Weights ``[K]`` and component means and variances ``[K, S, D]`` of the predictive:
        Gauss-Hermite nodes ``G_k`` of ``G``, and ``F | G_k`` Gaussian (``F`` and ``G`` jointly
        Gaussian) plus the noise ``c^2 + e^{G_k}`` (``calibrated=False``: at scale 1)."""
        if self.df is not None:
            log_weights, mean, var = self._t_mixture(features)
            if not calibrated:
                return log_weights.exp(), mean, var
            return self._scaled_mixture(log_weights.exp(), mean, var)
        w, comp_mean, cond_var, noise_var = self._nodes(features)
        if not calibrated:
            return w, comp_mean, cond_var + noise_var
        return self._scaled_mixture(w, comp_mean, cond_var + noise_var)

    def log_predictive(self, features: Moments, y: Tensor, calibrated: bool = True) -> Tensor:
        if self.df is None:
            return super().log_predictive(features, y, calibrated)
        return self._log_predictive_mixture(*self._t_mixture(features), y, calibrated)

    def _t_mixture(self, features: Moments) -> tuple[Tensor, Tensor, Tensor]:
        """With t noise: log weights ``[K L]`` and component means and variances
        ``[K L, S, D]``, the scale mixture of each Gauss-Hermite node of ``G``."""
        w, comp_mean, cond_var, noise_var = self._nodes(features)
        log_t, mean, var = self._scale_mixture(comp_mean, cond_var, noise_var)  # [L, K, S, D]
        log_weights = (log_t[:, None] + w.log()[None, :]).reshape(-1)
        return log_weights, mean.reshape(-1, *mean.shape[2:]), var.reshape(-1, *var.shape[2:])

    def _nodes(
        self, features: Moments, num_nodes: int | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Gauss-Hermite weights ``[K]`` and, at each node ``G_k`` of ``G``, ``E[F | G_k]``,
        ``Var[F | G_k]`` and the noise variance ``c^2 + e^{G_k}``, each ``[K, S, D]``
        (``K = num_nodes``, default :attr:`num_nodes`)."""
        mean, var, g_mean, g_var, cross = self._moments(features)
        z, w = gauss_hermite(num_nodes or self.num_nodes, mean.dtype, mean.device)
        g_std = g_var.sqrt()
        # F | G: mean shifted by Cov / sd(G) z, variance Var[F] - Cov^2 / Var[G]
        slope = torch.where(g_std > 0, cross / g_std.clamp_min(torch.finfo(g_std.dtype).tiny), 0)
        cond_var = (var - slope.square()).clamp_min(0)
        z = z.view(-1, 1, 1)
        comp_mean = mean + slope * z
        # the extreme nodes of a wide G would overflow exp (float32: above 88.7) and turn the
        # gradient into inf * 0 = NaN; capped at half the largest finite log (a noise
        # variance of e^44 in float32), where a component's density is negligible
        log_noise = (g_mean + g_std * z).clamp(max=0.5 * math.log(torch.finfo(g_mean.dtype).max))
        noise_var = log_noise.exp() + self.noise_floor**2
        return w, comp_mean, cond_var.expand_as(comp_mean), noise_var

    def extra_repr(self) -> str:
        floor = f", noise_floor={self.noise_floor}" if self.noise_floor else ""
        df = f", df={self.df:g}" if self.df is not None else ""
        return f"num_outputs={self.num_outputs}, num_nodes={self.num_nodes}{floor}{df}"


class StudentTHead(_StudentTNoise, _RegressionHead):
    r"""Robust regression: ``y = F + eps``, ``eps ~ t_nu(0, sigma)`` per output, a Student-t with
    ``nu`` degrees of freedom (fixed) and scale ``sigma`` (learned).

    Its tails are polynomial, so a target far from the predictive mean (a censored or
    mis-recorded row) costs ``(nu + 1) log |r|`` nats instead of the Gaussian's ``r^2 / 2``, and
    does not pull the fit or the noise towards itself (Jylaenki, Vanhatalo and Vehtari, "Robust
    Gaussian process regression with a Student-t likelihood", JMLR 2011; GPyTorch's
    ``StudentTLikelihood``). Everything else is the Gaussian head's:

    * :meth:`expected_nll` (the closed-form ELBO's data term):
      :func:`~pyro_gpn.losses.student_t_expected_nll`, Gauss-Hermite quadrature over ``F``.
    * :meth:`predictive_mixture` (the predictive objective, the test log-likelihood, the
      calibration): the Student-t written as a Gaussian scale mixture
      (:func:`~pyro_gpn.losses.student_t_scale_mixture`, ``K`` components, 90 at ``nu = 4``),
      so ``p(y) = sum_k w_k N(y | E[F], Var[F] + c_k sigma^2)``, exact given ``F``'s Gaussian
      to the mixture's accuracy (log density within 4e-7 of the t's). :meth:`log_predictive`
      sums it with log weights, which float32 keeps where the weights underflow.
    * :meth:`predictive` / :meth:`predict`: its mean and variance, ``Var[F] + sigma^2 nu /
      (nu - 2)`` (the outputs' variances: a full ``cov`` of ``F`` is used through its
      diagonal, as the outputs' noises are independent t's, not one multivariate t).
    * :meth:`observation`: ``StudentT(nu, F, sigma)`` (the Pyro routes).

    ``nu`` is not learned: choose it on validation rows (a small ``nu``, e.g. 4, for data with
    outliers; as ``nu`` grows the head approaches :class:`GaussianHead`).

    Args:
        num_outputs: ``D``, the width of the targets.
        df: ``nu``, ``2.5 <= nu <= 100`` (the noise has a variance).
        noise_scale_init: initial ``sigma``.
        shared: one ``sigma`` for all outputs.
        num_nodes: Gauss-Hermite nodes of :meth:`expected_nll`.
        dtype, device: of the parameter.

    Attributes:
        noise_scale: ``[D | 1]``, positive, ``sigma``: ``exp`` of ``noise_scale_unconstrained``.
        noise_std: ``[D | 1]``, the noise's standard deviation ``sigma sqrt(nu / (nu - 2))``.
        df: ``nu`` (a float; saved with the state as the buffer ``degrees_of_freedom``, and a
            state saved under another ``nu`` is refused on loading).
        predictive_scale: ``[D]`` buffer, the predictive's calibration scale (1: none; see
            the regression heads' base class).

    Shape:
        - features: :class:`~pyro_gpn.Moments` with mean ``[S, D]``.
        - y: ``[S, D]``.
    """

    def __init__(
        self,
        num_outputs: int,
        df: float = 4.0,
        noise_scale_init: float = 0.1,
        shared: bool = False,
        num_nodes: int = 32,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("num_outputs", num_outputs), ("num_nodes", num_nodes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (math.isfinite(noise_scale_init) and noise_scale_init > 0):
            raise ValueError(
                f"noise_scale_init must be positive and finite, got {noise_scale_init}"
            )
        self.num_outputs = num_outputs
        self.num_nodes = num_nodes
        factory = {"dtype": dtype or torch.get_default_dtype(), "device": device}
        self._init_student_t(df, factory)
        scale = torch.full((1 if shared else num_outputs,), float(noise_scale_init), **factory)
        self.noise_scale_unconstrained = nn.Parameter(scale.log())
        self._init_predictive_scale(self.num_outputs, factory)

    @property
    def noise_scale(self) -> Tensor:
        return self.noise_scale_unconstrained.exp()

    @property
    def noise_std(self) -> Tensor:
        return self.noise_scale * math.sqrt(self.df / (self.df - 2))

    def predictive(self, features: Moments) -> Moments:
        noise_var = self.noise_std.square().expand(features.num_features)
        scale = self.predictive_scale.to(features.mean.dtype)
        var = (features.variance + noise_var) * scale.square()
        return Moments(features.mean, var=var, validate=False)

    def expected_nll(self, features: Moments, y: Tensor, reduction: str = "mean") -> Tensor:
        return student_t_expected_nll(
            features, y, self.noise_scale, self.df, self.num_nodes, reduction=reduction
        )

    def observation(self, features: Tensor) -> dist.Distribution:
        return dist.StudentT(self.df, features, self.noise_scale).to_event(1)

    def predictive_mixture(
        self, features: Moments, calibrated: bool = True
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Weights ``[K]`` and component means and variances ``[K, S, D]`` of the predictive:
        ``N(E[F], Var[F] + c_k sigma^2)`` at the scale mixture's nodes (class docstring;
        ``calibrated=False``: at scale 1)."""
        log_weights, mean, var = self._mixture(features)
        if not calibrated:
            return log_weights.exp(), mean, var
        return self._scaled_mixture(log_weights.exp(), mean, var)

    def log_predictive(self, features: Moments, y: Tensor, calibrated: bool = True) -> Tensor:
        """As the other regression heads', summed with the mixture's log weights."""
        return self._log_predictive_mixture(*self._mixture(features), y, calibrated)

    def _mixture(self, features: Moments) -> tuple[Tensor, Tensor, Tensor]:
        noise_var = self.noise_scale.square().to(features.mean.dtype)
        return self._scale_mixture(features.mean, features.variance, noise_var)

    def extra_repr(self) -> str:
        return f"num_outputs={self.num_outputs}, df={self.df:g}, num_nodes={self.num_nodes}"


HEADS = {"gaussian": GaussianHead, "softmax": SoftmaxHead}
"""The head names networks accept, and the classes they stand for."""


def check_sizes(sizes: Sequence[int], head: str | Head | type[Head]) -> list[int]:
    """Validate network widths: at least 2 (no readout) or 3 (readout) positive integers,
    returned as Python ints (the rule of :func:`pyro_gpn._validation.integer_sizes`: NumPy
    integers and integral floats are converted, bools and fractions refused)."""
    sizes = integer_sizes(sizes)
    kind = HEADS[head] if isinstance(head, str) else head
    min_len = 3 if kind.has_readout else 2
    if len(sizes) < min_len or any(s < 1 for s in sizes):
        raise ValueError(
            f"sizes must be at least {min_len} positive integers for head={head!r}, got {sizes}"
        )
    return sizes


def make_head(
    head: str | Head,
    sizes: Sequence[int],
    *,
    noise_std_init: float = 0.1,
    shared_noise: bool = False,
    unscented_kappa: float | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Head:
    """The head of a network with widths ``sizes``: a :class:`Head` is checked and returned,
    a name (``"gaussian"``, ``"softmax"``) builds one.

    ``sizes`` is ``[M, N_1, ..., N_L]`` for a head without readout and ``[M, N_1, ..., N_L, C]``
    for one with.
    """
    if isinstance(head, str) and head not in HEADS:
        raise ValueError(f"head must be one of {tuple(HEADS)} or a Head, got {head!r}")
    if not isinstance(head, (str, Head)):
        raise TypeError(f"head must be a name or a Head, got {type(head).__name__}")
    sizes = check_sizes(sizes, head)
    if isinstance(head, Head):
        width = head.feature_sizes(sizes)[-1]
        if head.num_outputs != sizes[-1] or getattr(head, "in_features", width) != width:
            raise ValueError(f"head {head} does not fit the network widths {sizes}")
        own = {p.dtype for p in head.parameters()}
        if dtype is not None and own and own != {dtype}:
            raise ValueError(
                f"head parameters are {sorted(map(str, own))}, the network's {dtype}: build the "
                f"head with dtype={dtype}"
            )
        return head
    if HEADS[head].has_readout:
        return SoftmaxHead(sizes[-2], sizes[-1], unscented_kappa, dtype=dtype, device=device)
    return GaussianHead(sizes[-1], noise_std_init, shared_noise, dtype=dtype, device=device)
