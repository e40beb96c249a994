"""Fleet simulation: a request trace replayed through the real routing plugins, the real scaling step and the
engine simulator's scheduler, in virtual time (``llmfleet simulate``)."""
