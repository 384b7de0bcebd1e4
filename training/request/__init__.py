"""What decides a training request before launch: ``contract`` (the one contract between the workflow and the
trainer) and ``plan`` (per-GPU memory, time and cost in closed form). Standard library only: this package runs in
the request-check Lambda, the operator CLI, the CDK synth and the training image alike."""
