"""``coevolve bench reliability`` (``make chaos``): the fault campaign (``campaign``)."""
