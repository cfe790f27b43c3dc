"""Several processes: one run over several machines (or several processes on one), each process running the same
program on its own devices, joined by ``jax.distributed`` (``cluster``: explicit flags, SLURM's ``srun``, or JAX's
own detection), a watchdog that ends the others when one dies or hangs (``watchdog``), and the coordinator's
key-value store through which process 0 shares its run folder and all meet at the end (``store``). Docs:
docs/runs.md.

train.py names it in three lines (its import of ``launch``, ``launch.add_arguments`` and ``launch.start``); the rest
of the template asks only ``training/devices/mesh.py`` about the run's processes. Deleting this folder,
tests/training/processes/ and those three lines leaves a template for one process.

This file imports none of the modules: launch and the watchdog import ``store`` from the package, so an import of
launch here would make a cycle (the package -> launch -> watchdog -> the package)."""
