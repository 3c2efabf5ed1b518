"""Tests of hpcnb.pruning: FLOPs model, environments, encoder, agents, real pruning."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from torch.utils.flop_counter import FlopCounterMode

from hpcnb import models
from hpcnb.data import digits
from hpcnb.pruning import (
    EnvConfig,
    FlopsModel,
    HierarchicalGraph,
    LayerwiseEnv,
    PPOConfig,
    PruningEnv,
    TrainConfig,
    gnnrl_search,
    random_search,
    train_classifier,
    uniform_search,
)
from hpcnb.pruning.agents import learning_curve
from hpcnb.pruning.encoder import GNNFeaturesExtractor, MultiStageGNN
from hpcnb.pruning.hiergraph import level1_channel_graph
from hpcnb.pruning.problem import keep_counts, project_to_budget, uniform_ratios
from hpcnb.pruning.task import ModelPruningTask
from hpcnb.pruning.training import count_params

torch.set_num_threads(1)


class ToyProblem:
    """A chain of groups whose accuracy is a known function of the keep fractions."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        g = 4
        self.group_ids = [f"g{i}" for i in range(g)]
        self.group_sizes = np.array([8, 16, 16, 32])
        self.flops_model = FlopsModel(
            50.0, np.array([100.0, 400.0, 300.0, 800.0]), np.arange(g), np.arange(-1, g - 1), g
        )
        self.sens = np.array([3.0, 0.2, 1.0, 0.1])
        pairs = [
            level1_channel_graph(rng.normal(size=(8, 4, 3, 3)) if i else None, "conv", 8, 2)
            for i in range(g + 1)
        ]
        self.graph = HierarchicalGraph(
            op_x=np.stack([p[0] for p in pairs]),
            op_adj=np.stack([p[1] for p in pairs]),
            node_x=rng.normal(size=(g + 1, 3)).astype(np.float32),
            edge_index=np.array([np.arange(g), np.arange(1, g + 1)]),
            node_group=np.arange(-1, g),
            num_groups=g,
        )

    def accuracy(self, counts: np.ndarray) -> float:
        f = counts / self.group_sizes
        return float(np.exp(-(self.sens * (1 - f) ** 2).sum()))


@pytest.fixture(scope="module")
def split():
    return digits(0)


@pytest.fixture(scope="module")
def resnet(split):
    torch.manual_seed(0)
    model = models.resnet_cifar(depth=8, width=8, in_channels=1)
    train_classifier(model, split.x_train, split.y_train, TrainConfig(epochs=3))
    return model.eval()


@pytest.fixture(scope="module")
def task(resnet, split):
    return ModelPruningTask(resnet, torch.as_tensor(split.x_train[:2]), split.x_val, split.y_val)


def _conv_linear_flops(model: torch.nn.Module) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.zeros(1, 1, 8, 8))
    return counter.get_total_flops()


def test_flops_model_algebra():
    fm = FlopsModel(10.0, np.array([4.0, 6.0]), np.array([0, 1]), np.array([-1, 0]), 2)
    assert fm.total == 20.0
    assert fm(np.array([0.5, 0.5])) == pytest.approx(10.0 + 2.0 + 6.0 * 0.25)
    with pytest.raises(ValueError, match="fractions"):
        fm(np.ones(3))
    with pytest.raises(ValueError, match="out_group"):
        FlopsModel(0.0, np.ones(1), np.array([5]), np.array([-1]), 2)


def test_keep_counts_and_budget_helpers():
    toy = ToyProblem()
    counts = keep_counts(np.array([0.0, 0.5, 1.0, 0.26]), toy.group_sizes)
    assert counts.tolist() == [1, 8, 16, 8]
    keep = uniform_ratios(toy, 0.5)
    env = PruningEnv(toy)
    assert env.flops_ratio(keep) <= 0.5
    assert env.flops_ratio(np.minimum(keep + 0.1, 1.0)) > 0.5  # largest such ratio (grid 1/8)
    start, proposal = np.ones(4), np.full(4, 0.2)
    landed = project_to_budget(toy, start, proposal, 0.5)
    assert env.flops_ratio(landed) <= 0.5
    assert np.all(landed >= proposal - 1e-12)


def test_flops_formula_matches_flop_counter(task):
    counted = task.flops_model_of(("conv", "linear"))
    assert counted.total == pytest.approx(_conv_linear_flops(task.model))
    assert task.flops_model.total == pytest.approx(task.ir_graph.total_flops())


def test_flops_formula_matches_extracted_model(task):
    rng = np.random.default_rng(1)
    counted = task.flops_model_of(("conv", "linear"))
    for _ in range(3):
        counts = keep_counts(rng.uniform(0.1, 1.0, len(task.group_sizes)), task.group_sizes)
        small = task.extract(counts, ratios=False)
        assert counted(counts / task.group_sizes) == pytest.approx(_conv_linear_flops(small))


def test_extracted_model_smaller_and_equal_to_masked(task, split):
    counts = keep_counts(np.full(len(task.group_sizes), 0.5), task.group_sizes)
    small = task.extract(counts, ratios=False).eval()
    assert count_params(small) < 0.6 * count_params(task.model)
    x = torch.as_tensor(split.x_val[:16])
    with torch.no_grad():
        out = small(x)
        masked = torch.func.functional_call(
            task.model, task.masked_parameters(counts), (x,), strict=False
        )
    assert out.shape == (16, 10)
    torch.testing.assert_close(out, masked, atol=1e-4, rtol=1e-4)
    assert task.accuracy(task.group_sizes) > 0.5


def test_residual_groups_are_coupled(task):
    # layers.0 adds its conv2 output to the stem output: one group must hold both.
    members = {m.param for g in task.groups for m in g.members if m.axis == 0}
    coupled = [
        g
        for g in task.groups
        if {"stem.0.weight", "layers.0.conv2.weight"} <= {m.param for m in g.members}
    ]
    assert len(coupled) == 1
    assert "fc.weight" not in members  # classifier outputs are not prunable


def test_check_env_passes(task):
    check_env(PruningEnv(task, EnvConfig(target=0.5)), skip_render_check=True)
    check_env(LayerwiseEnv(task, EnvConfig(target=0.5)), skip_render_check=True)


@pytest.mark.parametrize("project", [True, False])
def test_constraint_holds_when_episode_ends(task, project):
    env = PruningEnv(task, EnvConfig(target=0.5, project=project))
    env.action_space.seed(3)
    successes = 0
    for episode in range(25):
        env.reset(seed=episode)
        terminated, steps = False, 0
        while not terminated:
            _, reward, terminated, truncated, info = env.step(env.action_space.sample())
            steps += 1
            assert not truncated
        assert steps <= 5
        if reward >= 0:
            successes += 1
            assert info["flops_ratio"] <= 0.5
            counts = keep_counts(info["keep"], task.group_sizes)
            assert task.flops_model(counts / task.group_sizes) <= 0.5 * task.flops_model.total
            assert reward == pytest.approx(task.accuracy(counts))
        else:
            assert reward == -1.0 and info["flops_ratio"] > 0.5
    assert successes > 0


def test_env_is_deterministic(task):
    def run() -> list[float]:
        env = PruningEnv(task)
        env.reset(seed=7)
        actions = np.random.default_rng(0).uniform(-1, 1, (5, len(task.group_sizes)))
        out = []
        for a in actions:
            obs, r, term, _, _ = env.step(a.astype(np.float32))
            out += [r, float(obs["node_x"].sum())]
            if term:
                break
        return out

    assert run() == run()


def test_encoder_shapes_and_gradients(task):
    space = PruningEnv(task).observation_space
    single = task.graph.observation(np.full(len(task.group_sizes), 0.7), 0.2)
    assert space.contains(single)
    obs = {k: torch.as_tensor(np.stack([o, o])) for k, o in single.items()}
    gnn = MultiStageGNN(obs["op_x"].shape[-1], obs["node_x"].shape[-1], hidden=8)
    node_emb, op_emb = gnn(obs)
    n = task.graph.num_nodes
    assert node_emb.shape == (2, n, 8) and op_emb.shape == (2, n, 8)
    ext = GNNFeaturesExtractor(space, hidden=8, stage2_layers=2)
    feats = ext(obs)
    g = len(task.group_sizes)
    assert feats.shape == (2, 2 * 8 + g * 8 + g + 1) == (2, ext.features_dim)
    feats.sum().backward()
    assert all(p.grad is not None for p in ext.parameters())


def test_baselines_meet_budget(task):
    for result in (uniform_search(task, 0.5), random_search(task, 0.5, samples=10)):
        assert result.flops_ratio <= 0.5
        assert 0.0 <= result.val_accuracy <= 1.0


def test_torch_pruning_peer(resnet):
    from hpcnb.pruning.peers import torch_pruning_at_budget

    x = torch.zeros(2, 1, 8, 8)
    peer = torch_pruning_at_budget(resnet, x, 0.5, num_classes=10)
    assert peer.macs_ratio <= 0.5
    assert count_params(peer.model) < count_params(resnet)
    assert peer.model(x).shape == (2, 10)


def test_gnnrl_mean_reward_rises_on_toy_problem():
    result = gnnrl_search(
        ToyProblem(), EnvConfig(target=0.5), PPOConfig(timesteps=768, n_steps=128, hidden=8, seed=0)
    )
    rewards = np.array(result.episode_rewards)
    assert len(rewards) >= 100
    assert rewards[-40:].mean() > rewards[:40].mean() + 0.05
    assert learning_curve(rewards, 10)[-1] == pytest.approx(rewards[-10:].mean())
    assert result.flops_ratio <= 0.5


def test_layerwise_env_always_meets_budget(task):
    env = LayerwiseEnv(task, EnvConfig(target=0.3))
    env.action_space.seed(0)
    for episode in range(5):
        env.reset(seed=episode)
        done = False
        while not done:
            _, reward, done, _, info = env.step(env.action_space.sample())
        assert info["flops_ratio"] <= 0.3 + 1e-9
        assert 0.0 <= reward <= 1.0


def test_compare_methods_small(task, split):
    from hpcnb.pruning.compare import EvaluationConfig, compare_methods, outcomes_table

    result = compare_methods(
        task,
        split,
        0.5,
        methods=("uniform", "torch_pruning"),
        evaluation=EvaluationConfig(
            finetune=TrainConfig(epochs=1), latency_batch=8, latency_repeats=2
        ),
    )
    outcomes, searches = result.outcomes, result.searches
    table = outcomes_table(outcomes)
    assert [o.method for o in outcomes] == ["original", "uniform", "torch_pruning"]
    assert table.loc[(0.5, "original")].flops_ratio == pytest.approx(1.0)
    for o in outcomes[1:]:
        assert o.flops_ratio <= 0.52
        assert o.params < outcomes[0].params
        assert o.latency_ms > 0
    for o in outcomes:
        assert o.n_test == len(split.y_test)
        assert o.acc_before == pytest.approx(o.correct_before / o.n_test)
        assert o.acc_after == pytest.approx(o.correct_after / o.n_test)
        assert len(o.speedup_samples) == 2
        assert o.speedup == pytest.approx(float(np.median(o.speedup_samples)))
    # Recalibrated BatchNorm statistics repair what uniform pruning breaks.
    uniform = outcomes[1]
    assert uniform.acc_before > uniform.acc_inherited
    assert "speedup_samples" not in table.columns
    assert set(searches) == {"uniform"}
    assert searches["uniform"].counts.tolist() == list(outcomes[1].counts)


def test_compare_methods_runs_a_registered_method(task, split):
    import copy

    from hpcnb.pruning.compare import (
        PRUNING_METHODS,
        EvaluationConfig,
        PrunedNetwork,
        PruningMethod,
        compare_methods,
    )

    seen = []

    def keep_everything(request):
        seen.append(request.target)
        return PrunedNetwork(copy.deepcopy(request.task.model), seconds=0.0)

    PRUNING_METHODS.register("test_keep_everything", PruningMethod(keep_everything))
    try:
        result = compare_methods(
            task,
            split,
            0.5,
            methods=("test_keep_everything",),
            evaluation=EvaluationConfig(
                finetune=TrainConfig(epochs=1), latency_batch=8, latency_repeats=2
            ),
        )
    finally:
        PRUNING_METHODS.unregister("test_keep_everything")
    assert seen == [0.5]
    original, kept = result.outcomes
    assert kept.method == "test_keep_everything" and kept.flops_ratio == pytest.approx(1.0)
    assert kept.acc_before == original.acc_before  # the same network, recalibrated alike
    assert kept.keep == () and result.searches == {}


def test_method_table_refuses_before_any_work():
    from hpcnb.plugins import PluginError
    from hpcnb.pruning.compare import METHODS, PRUNING_METHODS, compare_methods

    assert PRUNING_METHODS.names() == sorted(METHODS)
    assert PRUNING_METHODS.get("gnnrl_latency").needs_latency_model
    with pytest.raises(PluginError, match="unknown pruning method 'nope'"):
        compare_methods(None, None, 0.5, methods=("uniform", "nope"))
    with pytest.raises(ValueError, match="needs latency_model"):
        compare_methods(None, None, 0.5, methods=("gnnrl_latency",))
    with pytest.raises(PluginError, match="expected a PruningMethod"):
        compare_methods(None, None, 0.5, methods=("hpcnb.pruning.compare:METHODS",))


@pytest.mark.parametrize("name", ["vgg", "mobilenet_v2", "shufflenet", "densenet"])
def test_flops_formula_and_masking_across_zoo(name):
    spec = models.ZOO[name]
    model = spec.build("tiny").eval()
    x = spec.example_input("tiny")[:1]
    t = ModelPruningTask(model, x, torch.randn(4, *x.shape[1:]), torch.zeros(4, dtype=torch.long))
    counted = t.flops_model_of(("conv", "linear"))
    counts = keep_counts(
        np.random.default_rng(0).uniform(0.2, 1, len(t.group_sizes)), t.group_sizes
    )
    small = t.extract(counts, ratios=False).eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        out = small(x)
    assert counted(counts / t.group_sizes) == pytest.approx(counter.get_total_flops())
    with torch.no_grad():
        masked = torch.func.functional_call(model, t.masked_parameters(counts), (x,), strict=False)
    torch.testing.assert_close(out, masked, atol=1e-4, rtol=1e-4)
