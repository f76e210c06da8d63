"""hybridlab.eval"""
