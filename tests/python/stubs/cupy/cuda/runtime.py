def getDevice():
    return 0
