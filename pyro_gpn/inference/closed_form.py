r"""The paper's deterministic ELBO of the variational GPN, as a Pyro loss.

For a :class:`~pyro_gpn.models.variational.VariationalGPN` with ``L`` layers,
``eq:gpn_vi_sampling_l`` splits into ``L = -L_reg + L_pred`` (``eq:gpn_vi_l``):

.. math::

    L_{\rm reg} = \sum_l \sum_n \mathrm{KL}\big(q(U^l_{\star n}) \,\|\, p(U^l_{\star n})\big)
        \qquad (\text{eq:gpn\_vi\_sampling\_la}),

    L_{\rm pred} = \frac{S}{B} \sum_{s \in \text{batch}}
        \mathbb{E}_{Q(F^L_s \mid X^0_s)}\big[\log p(y_s \mid F^L_s)\big]
        \qquad (\text{eq:gpn\_lpred\_exp}).

``L_pred`` is evaluated by propagating means and variances (or covariances) layer by layer
(``eq:gpn_vi_a``, ``eq:gpn_vi_mu``, ``eq:gpn_vi_marginal_sigma_fl``,
``eq:gpn_vi_marginal_sigma2_fl``, through :meth:`GPNLayerBase.propagate
<pyro_gpn.layers.base.GPNLayerBase.propagate>`) and then

* regression: ``eq:gpn_lpred_marginal_final`` (:func:`pyro_gpn.losses.gaussian_expected_nll`,
  which keeps the ``-1/2 log 2 pi`` per output that the paper drops, so the value is the ELBO
  itself and comparable with :class:`~pyro.infer.Trace_ELBO`);
* classification: the unscented transform of the expected log-softmax
  (:func:`pyro_gpn.losses.unscented_cross_entropy`).

**Exactness.** With one GPN layer and observed inputs, regression, the propagated moments of
``F^1`` are exact and so is the objective: it equals the expectation of ``Trace_ELBO`` on
``VariationalGPN.model`` / ``.guide`` (tested to Monte Carlo precision). With more layers the
hidden activations are replaced by Gaussians with the same mean and variance (``eq:gpn_vi_qal``),
an approximation whose error is measured in the tests; the softmax head adds the unscented
transform's error.

**Cost.** Per step ``O(B sum_l N_l (M_l + R)) `` for the mean and variance path (``2R - 1``
exponentials per unit and sample with equidistant inducing points), ``O(B N_l^2 R^2)`` per layer
with ``mode="cov"``, and ``O(sum_l N_l R^3)`` for the Choleskys and the KL, one deterministic
pass instead of one forward pass of ``model`` and ``guide`` per particle.
"""

from __future__ import annotations

import warnings

import torch
from pyro.infer import ELBO
from pyro.infer.util import torch_item
from torch import Tensor

from ..models.variational import VariationalGPN

__all__ = ["ClosedFormELBO", "closed_form_elbo"]


def closed_form_elbo(
    vgpn: VariationalGPN, x: Tensor, y: Tensor | None = None, num_data: int | None = None
) -> Tensor:
    """The ELBO ``-L_reg + L_pred`` of ``vgpn`` on a (mini-)batch, differentiable, a scalar.

    Args:
        vgpn: the variational GPN.
        x: ``[B, M]`` inputs.
        y: ``[B, N_L]`` targets (gaussian head) or ``[B]`` labels (softmax head).
        num_data: ``S``, the size of the data set ``x`` is a batch of (default:
            ``vgpn.num_data``, else ``B``); the likelihood is scaled by ``S / B``.
    """
    if y is None:
        raise ValueError("the closed-form ELBO needs observations y")
    batch = x.shape[0]
    if batch == 0:
        raise ValueError("x has 0 samples (rows): the ELBO of an empty batch is undefined")
    num_data = vgpn.num_data if num_data is None else num_data
    scale = 1.0 if num_data is None else num_data / batch
    return scale * vgpn.expected_log_likelihood(x, y).sum() - vgpn.kl_divergence()


class ClosedFormELBO(ELBO):
    """The deterministic ELBO of a :class:`~pyro_gpn.models.variational.VariationalGPN`.

    The objective takes its model explicitly (as GPyTorch's ``VariationalELBO(likelihood,
    model, num_data)``), and is a drop-in loss for :class:`pyro.infer.SVI`::

        svi = SVI(vgpn.model, vgpn.guide, optim, loss=ClosedFormELBO(vgpn))
        svi.step(x, y)                      # or svi.step(x_batch, y_batch, num_data=S)

    It does not trace ``model`` and ``guide``: it evaluates :func:`closed_form_elbo` of its
    network with the step's arguments ``(x, y, num_data)``. The evaluation runs inside the
    network's ``pyro_method``\\ s, so every parameter goes through ``pyro.param`` and
    :class:`~pyro.infer.SVI` (which collects the parameters touched during
    :meth:`loss_and_grads`) optimises all of them. With ``pyro.settings``'
    ``module_local_params`` use ``ClosedFormELBO(vgpn)(vgpn.model, vgpn.guide)``, a
    ``torch.nn.Module`` whose forward is :meth:`differentiable_loss`, with a torch optimiser.

    Args:
        vgpn: the network whose ELBO this is. Deprecated: without it the network is found as
            the owner of the bound method ``model`` (a ``DeprecationWarning``; removed in the
            next release).

    Like Pyro's ELBOs, :meth:`loss` and :meth:`loss_and_grads` return the *negative* ELBO as a
    float; :meth:`differentiable_loss` returns it as a tensor.
    """

    def __init__(self, vgpn: VariationalGPN | None = None) -> None:
        super().__init__(num_particles=1, max_plate_nesting=1)
        if vgpn is None:
            warnings.warn(
                "ClosedFormELBO() without its network is deprecated: use ClosedFormELBO(vgpn)",
                DeprecationWarning,
                stacklevel=2,
            )
        elif not isinstance(vgpn, VariationalGPN):
            raise TypeError(f"vgpn must be a VariationalGPN, got {type(vgpn).__name__}")
        self.vgpn = vgpn

    def _get_trace(self, model, guide, args, kwargs):
        raise NotImplementedError("ClosedFormELBO evaluates the ELBO without tracing")

    def differentiable_loss(self, model, guide, *args, **kwargs) -> Tensor:
        """The negative ELBO as a differentiable scalar tensor (``model`` and ``guide`` are
        not called; ``args`` and ``kwargs`` are those of :func:`closed_form_elbo`)."""
        return -closed_form_elbo(self.vgpn or _owner(model, guide), *args, **kwargs)

    def loss(self, model, guide, *args, **kwargs) -> float:
        """The negative ELBO as a float (no gradients)."""
        with torch.no_grad():
            return torch_item(self.differentiable_loss(model, guide, *args, **kwargs))

    def loss_and_grads(self, model, guide, *args, **kwargs) -> Tensor:
        """The negative ELBO (a detached scalar tensor: no device sync); accumulates its
        gradients into the parameters."""
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        if loss.requires_grad:
            loss.backward(retain_graph=self.retain_graph)
        return loss.detach()


def _owner(model, guide) -> VariationalGPN:
    """The deprecated discovery of the network from its bound ``model`` and ``guide``."""
    owner = getattr(model, "__self__", None)
    if not isinstance(owner, VariationalGPN):
        raise ValueError(
            "ClosedFormELBO needs its network: ClosedFormELBO(vgpn) (the model given is not "
            "VariationalGPN.model)"
        )
    if getattr(guide, "__self__", None) is not owner:
        raise ValueError("model and guide must be methods of the same VariationalGPN")
    return owner
