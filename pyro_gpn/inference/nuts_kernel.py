"""Pyro's NUTS kernel with the per-transition statistics ArviZ's ``sample_stats`` needs
(used by :func:`pyro_gpn.inference.mcmc.run_nuts`)."""

from __future__ import annotations

import math

import torch
from pyro.infer import NUTS
from pyro.infer.mcmc.adaptation import BlockMassMatrix
from torch import Tensor

__all__ = ["STAT_NAMES", "RecordingNUTS", "ShrunkBlockMassMatrix"]


STAT_NAMES = ("energy", "lp", "n_steps", "tree_depth", "step_size", "acceptance_rate")


class ShrunkBlockMassMatrix(BlockMassMatrix):
    r"""Pyro's block mass matrix whose dense blocks are shrunk towards their own diagonal at the
    end of every warm-up window.

    Pyro (as Stan) sets a dense block to the window's sample covariance ``S`` (``n`` draws)
    regularised towards ``1e-3 I``. With fewer draws than dimensions (``n < D``; the first window
    has 25) ``S`` has rank ``n - 1``: the other directions get variance ``~1e-4``, far below
    their posterior scale, and NUTS then needs ~1000 leapfrog steps per iteration to move along
    them (measured on two moons, ``docs/results/nuts.md``). Here a dense block becomes

    .. math::

        \hat\Sigma = \frac{n}{n + D} S + \frac{D}{n + D} \operatorname{diag}(S),

    full rank with the sample variances on its diagonal, and tends to ``S`` as ``n / D`` grows
    (a fixed-weight Ledoit-Wolf-type shrinkage); Stan's ``n / (n + 5)`` scaling and ``1e-3``
    ridge are applied after it, as Pyro does. Diagonal blocks are Pyro's.
    """

    def end_adaptation(self):
        inverse_mass = {}
        for names, scheme in self._adapt_scheme.items():
            n = scheme.n_samples
            cov = scheme.get_covariance(regularize=False)
            if cov.dim() == 2:
                dim = cov.shape[0]
                weight = n / (n + dim)
                cov = weight * cov + (1 - weight) * torch.diag(cov.diagonal())
            cov = cov * (n / (n + 5.0))
            ridge = 1e-3 * 5.0 / (n + 5.0)
            cov = cov + ridge * (torch.eye(cov.shape[0], dtype=cov.dtype) if cov.dim() == 2 else 1)
            inverse_mass[names] = cov
        self.inverse_mass_matrix = inverse_mass


class RecordingNUTS(NUTS):
    """Pyro's NUTS that records per-transition statistics for ArviZ's ``sample_stats``.

    For every transition after warm-up: ``energy`` (the Hamiltonian at the start of the
    trajectory, kinetic energy of the fresh momentum plus the potential energy; NUTS conserves
    it along the trajectory up to the integrator's error, and it is what ArviZ's energy plot
    and BFMI need), ``n_steps`` (leapfrog steps = gradient evaluations), ``tree_depth``
    (``ceil(log2(n_steps + 1))``), ``step_size``, ``acceptance_rate`` (the mean Metropolis
    acceptance probability over the trajectory) and ``lp`` (the unnormalised log density of the
    kept state, minus the potential energy). One list per chain (sequential chains only: parallel
    chains run in other processes and their records are not returned).

    ``inverse_mass``: one metric per chain to start from, either a ``[D, D]`` matrix (one block)
    or ``{site: diagonal}`` (unconstrained, any block structure); adapted further in warm-up
    unless ``adapt_mass_matrix=False``. ``shrink_dense=True`` adapts dense mass-matrix blocks
    with :class:`ShrunkBlockMassMatrix` instead of Pyro's
    :class:`~pyro.infer.mcmc.adaptation.BlockMassMatrix`.
    """

    def __init__(
        self,
        *args,
        inverse_mass: list[Tensor | dict[str, Tensor]] | None = None,
        shrink_dense: bool = False,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if shrink_dense:
            self._adapter.mass_matrix_adapter = ShrunkBlockMassMatrix()
        self.inverse_mass = inverse_mass
        self.records: list[dict[str, list[float]]] = []
        self._kinetic: float | None = None
        self._in_sample = False
        self._grad_calls = 0

    def setup(self, warmup_steps, *args, **kwargs):
        super().setup(warmup_steps, *args, **kwargs)
        if self.inverse_mass is not None:
            given = self.inverse_mass[len(self.records) % len(self.inverse_mass)]
            current = self.mass_matrix_adapter.inverse_mass_matrix
            if isinstance(given, dict):  # per-site diagonals, spread over Pyro's blocks
                start = {}
                for block, old in current.items():
                    diag = torch.cat([given[name].reshape(-1) for name in block]).to(old)
                    start[block] = torch.diag(diag) if old.dim() == 2 else diag
            else:
                (block,) = current
                start = {block: given}
            self.mass_matrix_adapter.inverse_mass_matrix = start
            z, _, _ = self._fetch_from_cache()
            self._adapter.reset_step_size_adaptation(z)
        inner = self.potential_fn

        def counted(z):
            self._grad_calls += 1
            return inner(z)

        self.potential_fn = counted
        self.records.append({k: [] for k in STAT_NAMES})

    def _sample_r(self, name):
        r, r_unscaled = super()._sample_r(name)
        if self._in_sample and self._kinetic is None:
            self._kinetic = float(self._kinetic_energy(r_unscaled))
        return r, r_unscaled

    def sample(self, params):
        _, start_pe, _ = self._fetch_from_cache()
        t, mean_accept = self._t, self._mean_accept_prob
        self._in_sample, self._kinetic, self._grad_calls = True, None, 0
        try:
            z = super().sample(params)
        finally:
            self._in_sample = False
        if t >= self._warmup_steps and self._kinetic is not None:
            n = self._t - self._warmup_steps
            accept = n * self._mean_accept_prob - (n - 1) * mean_accept
            _, pe, _ = self._fetch_from_cache()
            steps = self._grad_calls
            rec = self.records[-1]
            rec["energy"].append(self._kinetic + float(start_pe))
            rec["lp"].append(-float(pe))
            rec["n_steps"].append(steps)
            rec["tree_depth"].append(math.ceil(math.log2(steps + 1)))
            rec["step_size"].append(float(self.step_size))
            rec["acceptance_rate"].append(float(accept))
        return z
