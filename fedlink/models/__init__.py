"""Model builders by name (``mlp``, ``logreg``, ``cnn``), losses and optimizers by name
(``fedlink.models.training``) and test-set evaluation; imports torch.

>>> from fedlink.models import build_model
>>> model = build_model("mlp", num_features=64, num_classes=10, seed=0, hidden=[32])
"""

from fedlink.models.base import MODELS, build_model, logreg, mlp
from fedlink.models.evaluate import Evaluator, UserEvaluator, dataset_tensors, evaluate

__all__ = ["MODELS", "Evaluator", "UserEvaluator", "build_model", "dataset_tensors", "evaluate",
           "logreg", "mlp"]
