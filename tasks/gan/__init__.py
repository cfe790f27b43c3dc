"""A generative adversarial network (Goodfellow et al., 2014) on MNIST, written only in files of its own: the update
is a step of its own (``step.py``: the discriminator and the generator updated in turn, each by its own optimizer, a
group of the config's ``optimizer.groups``), ``model.py`` (the two players in one model), ``losses.py`` (the
generator's loss, what evaluation reports, and the discriminator's), ``data.py`` (latent vectors paired with MNIST's
images), ``config.json``."""
