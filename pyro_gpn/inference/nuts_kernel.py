"""Pyro's NUTS kernel with the per-transition statistics ArviZ's ``sample_stats`` needs
(used by :func:`pyro_gpn.inference.mcmc.run_nuts`)."""

from __future__ import annotations

import math

from pyro.infer import NUTS
from torch import Tensor

__all__ = ["STAT_NAMES", "RecordingNUTS"]


STAT_NAMES = ("energy", "lp", "n_steps", "tree_depth", "step_size", "acceptance_rate")


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
    """

    def __init__(self, *args, inverse_mass: list[Tensor] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.inverse_mass = inverse_mass
        self.records: list[dict[str, list[float]]] = []
        self._kinetic: float | None = None
        self._in_sample = False
        self._grad_calls = 0

    def setup(self, warmup_steps, *args, **kwargs):
        super().setup(warmup_steps, *args, **kwargs)
        if self.inverse_mass is not None:
            (block,) = self.mass_matrix_adapter.inverse_mass_matrix
            matrix = self.inverse_mass[len(self.records) % len(self.inverse_mass)]
            self.mass_matrix_adapter.inverse_mass_matrix = {block: matrix}
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
