"""Acting: the categorical sampler against ``torch.distributions.Categorical``, and the
``ActingPath`` (the functional and numpy forwards) against the policy's module forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastvec.train.algo.optim import flatten_parameters
from fastvec.train.model.actor_critic import ACTIVATIONS, make_policy
from fastvec.train.model.distributions import CategoricalDist

N_DRAWS = 200_000
P_MIN = 1e-4  # a correct sampler fails a check with at most this probability, whatever the seed


def _check_frequencies(counts: np.ndarray, probs: np.ndarray, what: str) -> None:
    """Pearson's chi-square over the categories expected at least 5 times (the rest
    pooled) must not reject at ``P_MIN``; categories that together are expected less
    than 1e-3 times must never be drawn (that happens with probability < 1e-3)."""
    n = counts.sum()
    expected = n * probs
    big = expected >= 5
    rare_expected, rare_seen = expected[~big].sum(), counts[~big].sum()
    if rare_expected < 1e-3:
        assert rare_seen == 0, f"{what}: {rare_seen} draws of categories expected {rare_expected:.2g} times"
        obs, exp = counts[big], expected[big]
    else:
        assert rare_expected >= 5, "choose logits whose rare categories are clearly rare or clearly not"
        obs, exp = np.append(counts[big], rare_seen), np.append(expected[big], rare_expected)
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    # the chi-square distribution's survival function: Q(df / 2, chi2 / 2)
    p = (
        float(
            torch.special.gammaincc(
                torch.tensor(df / 2, dtype=torch.float64), torch.tensor(chi2 / 2, dtype=torch.float64)
            )
        )
        if df
        else 1.0
    )
    assert p > P_MIN, (
        f"{what}: chi-square {chi2:.1f} on {df} degrees of freedom (p = {p:.2g}); "
        f"counts {counts.tolist()}, expected {np.round(expected, 1).tolist()}"
    )


LOGITS = {
    "uniform": [0.0, 0.0, 0.0, 0.0],
    "mixed": [1.0, -0.5, 2.0, 0.3, -1.2],
    "two": [0.0, 0.1],
    "near-deterministic": [8.0, 0.0, 0.0],  # the others ~3e-4 each: 67 expected draws
    "deterministic": [30.0, 0.0, -30.0],  # the others ~1e-13: never drawn
}


@pytest.mark.parametrize("name", list(LOGITS))
def test_gumbel_max_sampler_matches_categorical(name):
    """``CategoricalDist.act_`` (the torch path) and the numpy actor (``ActingPath.numpy``:
    a one-layer policy whose output is the logits) draw each action with the
    probabilities of ``torch.distributions.Categorical(logits=...)``."""
    logits = torch.tensor(LOGITS[name])
    k = len(logits)
    probs = torch.distributions.Categorical(logits=logits.double()).probs.numpy()
    dist = CategoricalDist([k])
    torch.manual_seed(1234)
    noise = dist.sample_noise(torch.empty(dist.noise_shape(N_DRAWS)))
    out = torch.empty(N_DRAWS, dtype=torch.int64)
    with torch.inference_mode():
        dist.act_(logits.expand(N_DRAWS, k), noise, out)
    _check_frequencies(np.bincount(out.numpy(), minlength=k), probs, f"torch sampler, {name}")

    pol = make_policy(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(k), hidden=())
    with torch.no_grad():
        pol.actor_head.weight.zero_()  # no hidden layer: the head is the actor
        pol.actor_head.bias.copy_(logits)
    path = pol.acting_path()
    assert path.numpy is not None
    obs = torch.randn(N_DRAWS, 3)
    noise = pol.dist.sample_noise(torch.empty(pol.dist.noise_shape(N_DRAWS)))
    with torch.inference_mode():
        pol.act_(obs, noise, out)
    _check_frequencies(np.bincount(out.numpy(), minlength=k), probs, f"numpy sampler, {name}")
    with torch.inference_mode():  # deterministic: the most likely action, whatever the noise
        pol.act_(obs[:50], noise[:50], out[:50], deterministic=True)
    assert (out[:50] == int(np.argmax(probs))).all()


def test_masked_multidiscrete_sampler_matches_categorical():
    """Per component of a ``MultiDiscrete([3, 5, 2])``: the missing choices (masked to
    -inf) are never drawn, the others as ``Categorical`` over the valid logits."""
    dist = CategoricalDist([3, 5, 2])
    rows = torch.tensor([[0.5, -1.0, 1.5, 9.0, 9.0], [0.0, 1.0, 2.0, -1.0, 0.2], [-0.3, 0.4, 9.0, 9.0, 9.0]])
    torch.manual_seed(99)
    noise = dist.sample_noise(torch.empty(dist.noise_shape(N_DRAWS)))
    out = torch.empty(N_DRAWS, 3, dtype=torch.int64)
    with torch.inference_mode():
        dist.act_(rows.reshape(1, -1).expand(N_DRAWS, -1), noise, out)
    for j, n in enumerate([3, 5, 2]):
        counts = np.bincount(out[:, j].numpy(), minlength=5)
        assert counts[n:].sum() == 0, f"component {j} drew a missing choice"
        probs = torch.distributions.Categorical(logits=rows[j, :n].double()).probs.numpy()
        _check_frequencies(counts[:n], probs, f"component {j}")


def test_frequency_check_rejects_a_wrong_sampler():
    """The check above has power: a sampler off by 1% of probability mass fails it."""
    probs = np.array([0.2, 0.3, 0.5])
    counts = np.round(N_DRAWS * np.array([0.21, 0.29, 0.5])).astype(np.int64)
    with pytest.raises(AssertionError, match="chi-square"):
        _check_frequencies(counts, probs, "biased")
    with pytest.raises(AssertionError, match="never|draws of"):
        _check_frequencies(np.array([N_DRAWS - 1, 1, 0]), np.array([1 - 2e-13, 1e-13, 1e-13]), "rare")


# --------------------------------------------------------------------- the acting path
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize(
    "obs_space, norm",
    [
        (spaces.Box(-np.inf, np.inf, (6,), np.float64), True),
        (spaces.Box(-1, 1, (6,), np.float32), False),
        (spaces.Discrete(5, start=2), False),  # one-hot input
    ],
)
def test_functional_forward_is_the_module_forward(activation, obs_space, norm):
    """``ActingPath.params`` (no module dispatch) gives the module forward's numbers bit
    for bit, for every activation and input kind; the numpy twin exists exactly where
    it applies (tanh/relu, vector input, a plain categorical or a Gaussian)."""
    torch.manual_seed(0)
    for act_space in (
        spaces.Discrete(4),
        spaces.Box(-1, 1, (2,), np.float32),
        spaces.MultiDiscrete([2, 3]),
        spaces.Discrete(3, start=-1),
    ):
        pol = make_policy(obs_space, act_space, activation=activation, normalize_obs=norm)
        if isinstance(obs_space, spaces.Discrete):
            obs = torch.randint(2, 7, (9,))
        else:
            obs = torch.randn(9, 6, dtype=torch.float64 if obs_space.dtype == np.float64 else torch.float32)
            pol.update_obs_norm(torch.randn(40, 6) * 3 + 1)
        path = pol.acting_path()
        linears = [m for m in pol.stack("actor") if isinstance(m, torch.nn.Linear)]
        assert [(w is m.weight, b is m.bias) for (w, b), m in zip(path.layers, linears, strict=True)] == [
            (True, True)
        ] * len(linears)
        assert path.dist is pol.dist and path.obs_dim == pol.obs_dim and path.obs_norm is pol.obs_norm
        with torch.inference_mode():
            assert torch.equal(path.params(obs), pol.actor_params(obs))
            assert torch.equal(pol.actor_params_fast(obs), pol.actor_params(obs))
        numpy_applies = (
            activation in ("tanh", "relu")
            and not isinstance(obs_space, spaces.Discrete)
            and (isinstance(act_space, spaces.Box) or act_space == spaces.Discrete(4))
        )
        assert (path.numpy is not None) == numpy_applies, (activation, obs_space, act_space)


def test_acting_path_is_made_again_when_the_weights_move():
    """One path while the weights stay put (the optimiser steps in place); a new one
    after ``flatten_parameters`` and ``.to`` (its numpy views would read stale memory)."""
    pol = make_policy(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2))
    path = pol.acting_path()
    assert pol.acting_path() is path and path.current()
    with torch.no_grad():
        pol.stack("actor")[0].weight.add_(1.0)
    assert pol.acting_path() is path
    flatten_parameters(pol)
    assert not path.current()
    moved = pol.acting_path()
    assert moved is not path and moved.current()
    assert np.shares_memory(moved.numpy.layers[0][0], pol.stack("actor")[0].weight.detach().numpy())
    pol.to(torch.float64)
    assert pol.acting_path() is not moved
