"""hybridlab.train"""
