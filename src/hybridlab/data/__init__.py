"""hybridlab.data"""
