"""A variational autoencoder (Kingma and Welling, 2014) on MNIST-shaped images, written only in files of its own:
``model.py`` (the model, and its decoder as a model of its own), ``losses.py`` (the negative ELBO, and its KL and
reconstruction terms as metrics), ``data.py`` (MNIST's images in [0, 1], without labels), ``config.json``."""
