"""Code the trainer must run but cannot trust to behave, run in a child process with
bounds: a custom reward function (``trainer.tasks.reward_process``) and a
checkpoint's chat template (``trainer.hf.chat_sandbox``).

``child.BoundedChild`` is the parent's side: it starts ``python -m MODULE``,
talks to it over a socket pair in JSON lines, gives each call a time bound
(over it the child and everything it started are killed; the next call starts a
fresh one) and ends it with the parent. ``serve.serve`` is the child's side:
tie its life to the parent's, cap its memory, answer one JSON line per request.
Torch-free: the web process uses it to render a template at registration.
"""
