"""perf"""
