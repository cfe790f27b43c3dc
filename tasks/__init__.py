"""Tasks of your own, each in a folder of its own: its model, losses, metrics and data loader in files the template
does not ship, found by the registry by themselves (``model/registry.py``: every module here that decorates a
function with ``@register("<kind>")``), and its config beside them. A later template fix never touches these files.

The samples: ``tasks/vae/`` (a variational autoencoder: sampling in the forward pass, its KL logged as a metric of
its own, the decoder a model of its own), ``tasks/distillation/`` (a student trained on the labels and a teacher
run's softened outputs, named targets reported as the classifier it is), ``tasks/gan/`` (a GAN: a training step of
its own, two optimizers taking turns) and ``tasks/mean_teacher/`` (a step of its own whose teacher is an average of
the student). Delete a folder and its task is gone, with nothing else to edit.
"""
