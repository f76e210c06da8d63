"""hybridlab.models"""
