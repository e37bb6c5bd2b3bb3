"""system"""
