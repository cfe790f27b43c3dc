"""Knowledge distillation (Hinton et al., 2015), written only in files of its own: a student trained on a teacher
run's outputs, softened at a temperature. ``data.py``: the loader ``teacher_outputs`` (any loader's inputs, the
teacher, loaded with ``load_run``, giving the targets); ``losses.py``: the loss ``distillation`` (the KL from the
teacher's softened distribution to the student's, times T^2); ``config.json``: a small MLP student of the MNIST
sample's ConvNeXt."""
