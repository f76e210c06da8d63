"""hybridlab.plots"""
