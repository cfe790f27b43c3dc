"""The mean teacher (Tarvainen & Valpola, 2017), written only in files of its own: a teacher whose parameters are an
exponential moving average of the student's, and a consistency cost between the two on differently noised views of
each example, beside the student's cross-entropy on the labels. ``step.py``: the step ``mean_teacher``; the teacher
is the template's ``ema`` callback's average, which the step reads and advances; ``config.json``: an MLP on MNIST."""
