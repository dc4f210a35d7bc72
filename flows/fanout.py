"""placeholder"""
def stage_impl(cfg, stage):
    return None
