"""What every GPN layer shares: weights, inducing points, lengthscales, noise and propagation.

A GPN layer maps inputs ``X [S, M]`` to activations ``A = X W`` and passes each unit's
activation through its own activation function ``f_n``, a GP conditioned on virtual
observations at the inducing points ``V`` (paper, section "Parametric Gaussian Process
Neurons"). Given the activation, the response is Gaussian with

    E[f_n(a)] = alpha(a)^T beta_n,        Var[f_n(a)] = 1 - alpha(a)^T C_n alpha(a),

``alpha_r(a) = k(a, V_rn)``; the output adds noise ``N(0, sigma_n^2)``. A layer is built from
parts: the projection ``W``, the inducing grid ``V`` with its lengthscales, the output noise,
and a :class:`Response` -- where ``beta`` and ``C`` come from:

* :class:`~pyro_gpn.layers.parametric.VirtualObservations` (the layer
  :class:`~pyro_gpn.layers.GPNLayer`): targets fitted by maximum likelihood,
  ``beta = kappa U``, ``C = kappa``;
* :class:`~pyro_gpn.layers.variational.VariationalTargets` (the layer
  :class:`~pyro_gpn.layers.VariationalGPNLayer`): a Gaussian ``q(U)`` over the targets,
  ``beta = K^-1 mu_U``, ``C = K^-1 - K^-1 Sigma_U K^-1``, and its KL divergence to the prior.

The two layer classes are this class with a different default response; they declare no
argument of their own. Response options (``targets_init``, ``q_cov``, ...) pass through to the
response, and the response's attributes read (and assign) as the layer's (``layer.targets``).
"""

from __future__ import annotations

import math

import torch
from pyro.nn import PyroModule, PyroParam
from torch import Tensor, nn
from torch.distributions import constraints

from .._validation import (
    PARAMETER_DTYPES,
    as_input,
    check_device,
    check_device_available,
    check_finite,
    check_inputs,
    check_ndim,
    check_parameter_dtype,
    check_parameters_finite,
    check_shape,
)
from ..moments.gaussian import Moments
from ..moments.precision import DEFAULT_COMPUTE_DTYPE
from ..moments.propagate import MODES, Mode, is_equidistant
from ..pyro_module import GPNModule

__all__ = ["GPNLayerBase", "Response", "SHARE_OPTIONS"]

SHARE_OPTIONS = ("none", "layer")


class Response(GPNModule):
    """How a unit's virtual observations give ``beta [G, R]`` and ``C [G, R, R]``.

    ``G`` is the number of activation functions (``N``, or 1 with ``share="layer"``). A response
    is built from the layer's initial grid, ``Response(points [G, R], lengthscales [G],
    **options)``, and evaluated on the current one: every method gets the inducing points and
    lengthscales in the layer's compute dtype, and returns results in that dtype.
    """

    def weights(self, points: Tensor, lengthscales: Tensor) -> tuple[Tensor, Tensor]:
        """``beta [G, R]`` and ``C [G, R, R]`` of the conditional response."""
        raise NotImplementedError

    def mean_weights(self, points: Tensor, lengthscales: Tensor) -> Tensor:
        """``beta`` alone (the means-only mode); override when cheaper than :meth:`weights`."""
        return self.weights(points, lengthscales)[0]

    def factored_weights(
        self, points: Tensor, lengthscales: Tensor, with_reduction: bool = True
    ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """``beta``, ``C`` and, where the response has them, factors ``L``, ``M`` with
        ``C = L^-T M L^-1`` (``M = None`` meaning the identity). ``with_reduction=False``: a
        response with factors may leave ``C`` out (``None``), for callers that use only them.

        The factors let :func:`~pyro_gpn.moments.response_moments` evaluate the conditional
        variance ``1 - x^T M x``, ``x = L^-1 alpha(a)``, without the ``eps * cond(K + S)``
        error of ``alpha^T C alpha`` (``variance_cholesky`` / ``variance_inner`` there;
        ``docs/results/accuracy.md``). The default has none: ``(beta, C, None, None)``.
        """
        beta, reduction = self.weights(points, lengthscales)
        return beta, reduction, None, None

    def variance_factor(self, points: Tensor, lengthscales: Tensor) -> Tensor | None:
        """The lower ``L [G, R, R]`` of :meth:`factored_weights` (``C = L^-T M L^-1``) alone,
        without the rest of the algebra, or ``None`` where the response has no factors. Its
        ``||L^-1||_F^2`` bounds the explicit ``C``'s rounding error (:func:`respond
        <pyro_gpn.layers.respond.respond>`)."""
        return None

    def kl_divergence(self, points: Tensor, lengthscales: Tensor) -> Tensor:
        """``KL(q(U) || p(U))`` summed over the functions; zero for point estimates."""
        return points.new_zeros(())

    def penalised_variances(self) -> Tensor | None:
        """The variances the maximum-likelihood penalty ``eq:gpn_ls`` acts on, if any."""
        return None


class GPNLayerBase(GPNModule):
    """A layer of GPN units: projection, inducing grid, output noise and a :class:`Response`.

    Args:
        in_features: ``M``, the number of inputs.
        out_features: ``N``, the number of GPN units.
        num_inducing: ``R`` virtual observations per unit (paper: 14).
        share: ``"none"`` (one activation function per unit) or ``"layer"`` (one activation
            function for the whole layer: inducing points, targets, their variances, the
            lengthscale and the noise are shared, shapes with leading dimension 1).
        learn_inducing: learn the inducing points (paper: fixed).
        inducing_range: the interval the inducing points are spaced linearly in.
        lengthscale_init: initial lengthscale ``lambda`` (the authors' code: 0.4).
        noise_std_init: initial output noise standard deviation ``sigma``.
        output_noise: give the layer output noise (``False``: no ``noise_std``; the last layer
            below a Gaussian head, whose observation noise the head owns).
        response: a :class:`Response` instance or class; ``None`` is the class's
            :attr:`default_response`.
        **response_options: passed to the response class (see
            :class:`~pyro_gpn.layers.parametric.VirtualObservations`,
            :class:`~pyro_gpn.layers.variational.VariationalTargets`).
        compute_dtype: dtype the GP algebra (``beta``, ``C`` and the output moments) is
            evaluated in; inputs, parameters and results keep their own dtype. The default,
            float64, is needed for float32 parameters: the output variance
            ``1 - tr[(C - beta beta^T) Omega] - mu^2`` subtracts numbers of order
            ``|beta|^2`` and ``|C|`` (hundreds to thousands once the target variances ``S``
            are small), so float32 loses it (``docs/results/docstring_notes.md``) and gradient
            descent exploits the error. ``None`` computes in the
            parameters' dtype, which is what the fused float32 Triton kernels need
            (:mod:`pyro_gpn.moments.backend`); use it only with well-conditioned layers. (The
            fused CPU layer, :mod:`pyro_gpn.moments.cpu_layer`, computes in float64: it serves
            ``"mean"`` mode whatever this says, and the variances only in float64.) Only
            float32 and float64 are accepted.
        dtype, device: of the parameters.

    Raises:
        ValueError: a size that is not a positive integer (bools included), fewer than two
            inducing points, an unknown ``share``, a ``compute_dtype`` other than float32,
            float64 or ``None``, a parameter ``dtype`` other than float32 or float64, or an
            unavailable ``device``.

    Attributes:
        weight: ``[M, N]``, Glorot-uniform (paper, "Initialization").
        inducing_points: ``[N | 1, R]`` (a buffer unless ``learn_inducing``).
        lengthscales: ``[N | 1]``, positive (``PyroParam``).
        noise_std: ``[N | 1]``, positive (``PyroParam``), or ``None`` without output noise.
        response: the :class:`Response`.
    """

    #: the response class used when none is given
    default_response: type[Response] | None = None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_inducing: int = 14,
        share: str = "none",
        *,
        learn_inducing: bool = False,
        inducing_range: tuple[float, float] = (-2.0, 2.0),
        lengthscale_init: float = 0.4,
        noise_std_init: float = 0.1,
        output_noise: bool = True,
        response: Response | type[Response] | None = None,
        compute_dtype: torch.dtype | None = DEFAULT_COMPUTE_DTYPE,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        **response_options,
    ) -> None:
        super().__init__()
        for name, value in (
            ("in_features", in_features),
            ("out_features", out_features),
            ("num_inducing", num_inducing),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if num_inducing < 2:
            raise ValueError(
                f"num_inducing must be at least 2 (an activation function is interpolated "
                f"between its inducing points), got {num_inducing}"
            )
        if share not in SHARE_OPTIONS:
            raise ValueError(f"share must be one of {SHARE_OPTIONS}, got {share!r}")
        low, high = inducing_range
        if not low < high:
            raise ValueError(f"inducing_range must be increasing, got {inducing_range}")
        for name, value in (
            ("lengthscale_init", lengthscale_init),
            ("noise_std_init", noise_std_init),
        ):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive and finite, got {value}")
        if compute_dtype is not None and compute_dtype not in PARAMETER_DTYPES:
            raise ValueError(
                f"compute_dtype must be torch.float32, torch.float64 or None, got "
                f"{compute_dtype!r} (the GP algebra's Cholesky factorisations need float32 or "
                "float64)"
            )
        self.compute_dtype = compute_dtype
        factory = {
            "dtype": check_parameter_dtype("dtype", dtype),
            "device": check_device_available("device", device),
        }
        self.in_features = in_features
        self.out_features = out_features
        self.num_inducing = num_inducing
        self.share = share
        self.learn_inducing = learn_inducing
        groups = 1 if share == "layer" else out_features
        self.num_functions = groups

        bound = math.sqrt(6.0 / (in_features + out_features))
        self.weight = nn.Parameter(
            torch.empty(in_features, out_features, **factory).uniform_(-bound, bound)
        )
        points = torch.linspace(low, high, num_inducing, **factory).expand(groups, -1).clone()
        if learn_inducing:
            self.inducing_points = nn.Parameter(points)
        else:
            self.register_buffer("inducing_points", points)
        self.lengthscales = PyroParam(
            torch.full((groups,), lengthscale_init, **factory), constraints.positive
        )
        if output_noise:
            self.noise_std = PyroParam(
                torch.full((groups,), noise_std_init, **factory), constraints.positive
            )
        else:
            self.noise_std = None
        response = self.default_response if response is None else response
        if isinstance(response, type) and issubclass(response, Response):
            response = response(points.detach(), self.lengthscales.detach(), **response_options)
        elif not isinstance(response, Response):
            raise TypeError(f"response must be a Response or its class, got {response!r}")
        elif response_options:
            raise TypeError(f"options {sorted(response_options)} need a response class")
        self.response = response
        self._register_load_state_dict_pre_hook(self._upgrade_state_dict)
        self._decide_equidistant()  # here, not inside the first training step

    def _upgrade_state_dict(self, state_dict: dict, prefix: str, *args) -> None:
        """Load v0.1 state dicts, which kept the response's parameters on the layer."""
        for name in self.response.state_dict():
            old, new = prefix + name, f"{prefix}response.{name}"
            if old in state_dict and new not in state_dict:
                state_dict[new] = state_dict.pop(old)

    # ------------------------------------------------------------------ the response's names
    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            response = self.__dict__.get("_modules", {}).get("response")
            if response is None or name.startswith("__"):
                raise
            return getattr(response, name)

    def __setattr__(self, name: str, value) -> None:
        response = self.__dict__.get("_modules", {}).get("response")
        if response is not None and name != "response" and _owns(response, name):
            setattr(response, name, value)
        else:
            super().__setattr__(name, value)

    # ------------------------------------------------------------------ numerics
    @property
    def _equidistant(self) -> bool | None:
        """Whether the fixed inducing points are equally spaced (``None`` for learned points).

        Decided from the buffer itself and decided again whenever it changes (a new tensor,
        or an in-place write such as :meth:`load_state_dict`'s copy: ``Tensor._version``), so
        that points loaded from a state dict, for example those of a layer trained with
        ``learn_inducing=True``, are never replaced by an even grid between their end points.
        """
        return self._decide_equidistant()

    def _decide_equidistant(self) -> bool | None:
        """:attr:`_equidistant`, decided again only if the buffer changed (a decision reads
        the points back: a device sync, so :meth:`__init__` makes the first one)."""
        if self.learn_inducing:
            return None
        points = self.inducing_points
        cached = self.__dict__.get("_equidistant_cache")
        if cached is None or cached[0] is not points or cached[1] != points._version:
            cached = (points, points._version, is_equidistant(points))
            self.__dict__["_equidistant_cache"] = cached
        return cached[2]

    def to_compute(self, tensor: Tensor) -> Tensor:
        """``tensor`` in :attr:`compute_dtype` (unchanged if that is ``None``); differentiable."""
        return tensor if self.compute_dtype is None else tensor.to(self.compute_dtype)

    def compute_inducing_points(self) -> Tensor:
        """``[N | 1, R]`` inducing points in :attr:`compute_dtype`.

        Fixed, equally spaced points are regenerated from their end points, so that they are
        equally spaced to the precision of the compute dtype: the midpoint expansion
        (:func:`~pyro_gpn.moments.propagate.midpoint_expansion`) assumes it, and float32
        points cast to float64 are only equally spaced to about 1e-7, an error the large
        weights of a nearly noise-free layer amplify.
        """
        points = self.to_compute(self.inducing_points)
        if not self._equidistant:
            return points
        first, last = points[..., :1], points[..., -1:]
        steps = torch.arange(points.shape[-1], dtype=points.dtype, device=points.device)
        return first + (last - first) * steps / (points.shape[-1] - 1)

    def compute_grid(self) -> tuple[Tensor, Tensor]:
        """Inducing points ``[N | 1, R]`` and lengthscales ``[N | 1]`` in :attr:`compute_dtype`."""
        return self.compute_inducing_points(), self.to_compute(self.lengthscales)

    # ------------------------------------------------------------------ the response
    def response_weights(self) -> tuple[Tensor, Tensor]:
        """``beta [N | 1, R]`` and ``C [N | 1, R, R]`` of the conditional response, in
        :attr:`compute_dtype`."""
        return self.response.weights(*self.compute_grid())

    def response_factored_weights(
        self, with_reduction: bool = True
    ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """:meth:`Response.factored_weights` on the layer's grid, in :attr:`compute_dtype`."""
        return self.response.factored_weights(*self.compute_grid(), with_reduction=with_reduction)

    def _needs_factors(self) -> bool:
        """Hand the response's Cholesky factors to ``response_moments`` (the reference path)
        only below float64: there the explicit ``C`` loses ``eps * cond(K + S)`` to rounding
        (``docs/results/accuracy.md``), while in float64 it is accurate to ~1e-6 for the target
        variances trained networks reach (``S >= 1e-4``) and runs on the fused CPU kernels."""
        dtype = self.compute_dtype or self.weight.dtype
        return dtype != torch.float64

    def response_mean_weights(self) -> Tensor:
        """``beta`` alone, for the means-only mode."""
        return self.response.mean_weights(*self.compute_grid())

    def kl_divergence(self) -> Tensor:
        """The response's ``KL(q(U) || p(U))`` over the functions, a scalar in the parameters'
        dtype (zero for point-estimated targets)."""
        return self.response.kl_divergence(*self.compute_grid()).to(self.weight.dtype)

    def _compute_noise_var(self) -> Tensor | None:
        """``sigma^2 [N | 1]`` in :attr:`compute_dtype`, or ``None`` without output noise."""
        return None if self.noise_std is None else self.to_compute(self.noise_std.square())

    # ------------------------------------------------------------------ evaluation
    def conditional(self, activations: Tensor, noise: bool = True) -> tuple[Tensor, Tensor]:
        """Mean and variance of each unit's output given its activation, sample by sample.

        ``eq:gpn_parametrized_mu_sigma_y_sn`` restricted to the diagonal over samples (the only
        part the per-sample training objective needs, ``eq:gpn_parametrized_loss``).

        Args:
            activations: ``[S, N]`` activations ``a`` (not inputs: ``a = x @ weight``).
            noise: include the output noise ``sigma^2`` (the output ``X``) or not (the
                response ``F``).

        Returns:
            ``mean [S, N]`` and ``var [S, N]``.
        """
        activations = as_input("activations", activations, self.weight, "the parameters are")
        check_shape("activations", activations, (None, self.out_features))
        check_finite("activations", activations)
        return self._conditional(activations, noise)

    def _conditional(self, activations: Tensor, noise: bool = True) -> tuple[Tensor, Tensor]:
        """:meth:`conditional` without the argument checks (for the library's own draws)."""
        out_dtype = activations.dtype
        activations = self.to_compute(activations)
        beta, reduction = self.response_weights()
        ls = self.to_compute(self.lengthscales).expand(self.out_features)
        points = self.compute_inducing_points().expand(self.out_features, -1)
        diff = activations.unsqueeze(-1) - points  # [S, N, R]
        alpha = (-0.5 * (diff / ls.unsqueeze(-1)).square()).exp()
        mean = torch.einsum("snr,nr->sn", alpha, beta.expand(self.out_features, -1))
        quad = torch.einsum(
            "snr,nrt,snt->sn", alpha, reduction.expand(self.out_features, -1, -1), alpha
        )
        var = (1 - quad).clamp_min(0).to(out_dtype)
        if noise and self.noise_std is not None:
            var = var + self.noise_std.square()
        return mean.to(out_dtype), var

    def propagate(
        self, inputs: Moments | Tensor, mode: Mode = "meanvar", noise: bool = True
    ) -> Moments:
        """Moments of the layer's outputs given the moments of its inputs.

        Args:
            inputs: :class:`Moments` of the inputs ``[S, M]``, or a tensor (or NumPy array) of
                deterministic inputs, which give exact output moments (the first layer).
                Floating inputs are cast to the parameters' dtype; they must be on the
                parameters' device (:mod:`pyro_gpn._validation`).
            mode: ``"mean"`` (all variances taken as zero, the paper's "GPN mean"),
                ``"meanvar"`` (variances, ``eq:gpn_normal_Sigmatilde``) or ``"cov"`` (full
                covariance, ``eq:gpn_normal_Sigmatilde_cov``).
            noise: include the output noise ``sigma^2`` (if the layer has any).

        Returns:
            :class:`Moments` ``[S, N]``.

        Shape:
            inputs ``[S, M]`` -> outputs ``[S, N]`` (``var [S, N]`` or ``cov [S, N, N]``).
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        inputs = self.validate_inputs(inputs)
        check_parameters_finite(self, f"the {type(self).__name__}")
        return self._propagate(inputs, mode, noise)

    def validate_inputs(self, inputs: Moments | Tensor, name: str = "inputs") -> Moments:
        """The layer's public boundary: ``inputs [S, M]`` (a floating tensor, a NumPy array or
        :class:`Moments`) cast to the parameters' dtype, on their device, finite, with
        ``M = in_features``; returned as :class:`Moments` (the rule in
        :mod:`pyro_gpn._validation`)."""
        if not isinstance(inputs, Moments):
            inputs = as_input(name, inputs, self.weight, "the layer's parameters are")
            check_ndim(name, inputs, 2)
            check_inputs(name, inputs)
            inputs = Moments(inputs, validate=False)
        else:
            check_device(name, inputs.mean, self.weight.device, "the layer's parameters are")
            if inputs.mean.dtype != self.weight.dtype:
                inputs = inputs.to(self.weight.dtype)
        if inputs.num_features != self.in_features:
            raise ValueError(
                f"{name} must have {self.in_features} features, got {inputs.num_features}"
            )
        return inputs

    def activation_moments(self, inputs: Moments, mode: Mode = "meanvar") -> Moments:
        """Moments of the activations ``A = X W`` given checked input :class:`Moments`
        (``eq:gpn_normal_a``; all variances zero in ``"mean"`` mode).

        Shape:
            inputs ``[S, M]`` -> activations ``[S, N]`` (``var [S, N]`` or ``cov [S, N, N]``).
        """
        if mode == "mean":
            return Moments(inputs.mean @ self.weight, validate=False)
        if mode == "cov":
            return inputs.linear_full(self.weight)
        return inputs.diagonal().linear(self.weight)

    def _propagate(self, inputs: Moments, mode: Mode = "meanvar", noise: bool = True) -> Moments:
        """:meth:`propagate` of checked :class:`Moments` (the network's inner layers): the
        activations' moments, then the response (:func:`~pyro_gpn.layers.respond.respond`)."""
        from .respond import respond

        return respond(self, self.activation_moments(inputs, mode), mode, noise)

    def forward(self, inputs: Moments | Tensor, mode: Mode = "meanvar") -> Moments:
        """:meth:`propagate` with output noise.

        Shape:
            inputs ``[S, M]`` -> :class:`Moments` ``[S, N]``.
        """
        return self.propagate(inputs, mode)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"num_inducing={self.num_inducing}, share={self.share!r}, "
            f"learn_inducing={self.learn_inducing}"
        )


def _owns(module: PyroModule, name: str) -> bool:
    """Whether ``name`` is a parameter, ``PyroParam`` or buffer of ``module``."""
    return any(
        name in module.__dict__.get(store, ())
        for store in ("_pyro_params", "_parameters", "_buffers")
    )
